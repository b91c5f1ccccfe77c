"""The exporter-toolkit web config file (--web.config.file): TLS, basic auth, SSL context.

The schema is exporter-toolkit's (docs/web-configuration.md), so a node_exporter web config
loads unchanged: `tls_server_config` (cert_file, key_file, client_ca_file,
client_auth_type, client_allowed_sans, min_version, max_version, cipher_suites,
prefer_server_cipher_suites, curve_preferences), `http_server_config` (http2, headers),
`basic_auth_users` and `basic_auth_excluded_paths`.
"""

from __future__ import annotations

import os
import re
import ssl
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, NoReturn, cast, get_args

from exporter.bounded_files import FileRefused, load_yaml, read_regular_file
from exporter.errors import ConfigError

ClientAuthType = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
TlsVersionName = Literal["TLS10", "TLS11", "TLS12", "TLS13"]

_CLIENT_AUTH_TYPES: Final[tuple[str, ...]] = get_args(ClientAuthType)
_TLS_VERSION_NAMES: Final[tuple[str, ...]] = get_args(TlsVersionName)
_TLS_VERSIONS: Final[Mapping[str, ssl.TLSVersion]] = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# As exporter-toolkit maps them to Go's tls.ClientAuthType, except where Python's ssl, which
# cannot accept a client certificate without verifying it, forces a choice:
# - RequestClientCert (Go: ask for a certificate, never check it) is CERT_NONE. kvcap never
#   reads the client's identity, so both admit exactly the same clients.
# - RequireAnyClientCert (Go: any certificate, unverified) needs client_ca_file here and
#   verifies against it, like RequireAndVerifyClientCert: stricter, never weaker.
_VERIFY_MODES: Final[Mapping[str, ssl.VerifyMode]] = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_NONE,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_NEEDS_CLIENT_CA: Final = frozenset(
    {"RequireAnyClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert"}
)
_TOP_LEVEL_FIELDS: Final = (
    "tls_server_config",
    "http_server_config",
    "basic_auth_users",
    "basic_auth_excluded_paths",
)
_TLS_FIELDS: Final = (
    "cert_file",
    "key_file",
    "client_ca_file",
    "client_auth_type",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
_HTTP_FIELDS: Final = ("http2", "headers")
# Go's crypto/tls names (tls.CipherSuites(), as exporter-toolkit accepts them) -> OpenSSL's.
# The TLS 1.3 suites cannot be configured in Go either: accepted, and left as they are.
GO_CIPHER_SUITES: Final[Mapping[str, str | None]] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}
# Go's tls.CurveID names -> OpenSSL's group names.
GO_CURVES: Final[Mapping[str, str]] = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
    "X25519MLKEM768": "X25519MLKEM768",
}
# exporter-toolkit's http_server_config.headers: the only five it allows, and the values it
# checks (case-insensitively).
_HEADER_VALUES: Final[Mapping[str, tuple[str, ...] | None]] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-Content-Type-Options": ("nosniff",),
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}
# Bounds on http_server_config.headers: a value and all of them together, sent on every
# response. The longest real one, a Content-Security-Policy, is a few hundred bytes.
MAX_HEADER_VALUE_BYTES: Final = 4096
MAX_HEADERS_BYTES: Final = 8192
_NOT_FIELD_VALUE: Final = re.compile(r"[^\x20-\x7e\t]")
# The web config file: a real one is well under a KiB (node_exporter's examples: ~1 KiB).
MAX_WEB_CONFIG_BYTES: Final = 1024 * 1024
# A certificate chain, its key or a CA bundle (a bundle of every public CA is ~220 KiB).
MAX_TLS_FILE_BYTES: Final = 1024 * 1024
# Keys of the file shown in an error: the message stays one line of bounded length.
_PRINTABLE_KEY: Final = re.compile(r"[\x21-\x7e]*")
_MAX_SHOWN: Final = 64
_SAN_CLIENT_AUTH: Final = frozenset({"RequireAnyClientCert", "RequireAndVerifyClientCert"})
# Modular crypt format of bcrypt: variant, two-digit cost 04..31, 22 salt + 31 hash characters.
BCRYPT_HASH: Final = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """`tls_server_config`, with paths already resolved against the config file's folder."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: ClientAuthType = "NoClientCert"
    min_version: TlsVersionName = "TLS12"
    max_version: TlsVersionName = "TLS13"
    cipher_suites: tuple[str, ...] = ()  # Go names; empty: OpenSSL's defaults
    prefer_server_cipher_suites: bool = True
    curve_preferences: tuple[str, ...] = ()  # Go names; empty: OpenSSL's defaults
    client_allowed_sans: tuple[str, ...] = ()  # empty: any verified client certificate

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file the SSL context is built from; a change to any of them means a rebuild."""
        extra = () if self.client_ca_file is None else (self.client_ca_file,)
        return (self.cert_file, self.key_file, *extra)


@dataclass(frozen=True, slots=True)
class WebConfig:
    """A parsed web config file; the default (no TLS, no users) serves plain, open HTTP."""

    tls: TlsConfig | None = None
    basic_auth_users: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # http_server_config.headers, in the file's order, blank ones left out.
    response_headers: tuple[tuple[str, str], ...] = ()
    # http_server_config.http2: accepted; kvcap serves HTTP/1.1 only (ALPN http/1.1).
    http2: bool = True
    basic_auth_excluded_paths: tuple[str, ...] = ()

    def auth_required(self, path: str) -> bool:
        """Whether a request for `path` must carry basic auth (exact paths, as
        exporter-toolkit's basic_auth_excluded_paths)."""
        return bool(self.basic_auth_users) and path not in self.basic_auth_excluded_paths


def read_web_config_file(path: Path | str) -> WebConfig:
    """Read a web config file and check its schema, without opening the TLS files.

    Read as every file kvcap did not choose is (bounded_files): a regular file only, so a
    FIFO put in its place cannot hang start-up or a reload, and at most MAX_WEB_CONFIG_BYTES."""
    path = Path(path)
    try:
        text = read_regular_file(path, max_bytes=MAX_WEB_CONFIG_BYTES).decode("utf-8")
    except (OSError, ValueError, FileRefused) as exc:
        raise ConfigError(f"web config file {path}: cannot read it: {exc}") from exc
    return parse_web_config(text, base_dir=path.parent)


def parse_web_config(text: str, *, base_dir: Path) -> WebConfig:
    """Parse the YAML text of a web config file; relative paths are taken from `base_dir`."""
    try:
        # PyYAML's safe loader with aliases refused and nesting capped (bounded_files).
        document = load_yaml(text)
    except FileRefused as exc:
        raise ConfigError(f"web config: {exc}") from exc
    if document is None:  # an empty file, as exporter-toolkit allows
        return WebConfig()
    fields = _mapping(document, "", _TOP_LEVEL_FIELDS)
    tls_document = fields.get("tls_server_config")
    users_document = fields.get("basic_auth_users")
    http2, headers = _parse_http(fields.get("http_server_config"))
    return WebConfig(
        tls=None if tls_document is None else _parse_tls(tls_document, base_dir),
        basic_auth_users=MappingProxyType(
            {} if users_document is None else _parse_users(users_document)
        ),
        response_headers=headers,
        http2=http2,
        basic_auth_excluded_paths=_strings(fields, "basic_auth_excluded_paths", "", paths=True),
    )


def build_ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """A server-side SSL context for `tls`; ConfigError names the file that does not load."""
    # A bare PROTOCOL_TLS_SERVER context, not create_default_context(): that one would also
    # trust the system CAs for client certificates, letting any public certificate in.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        # Python deprecates TLS 1.0/1.1; exporter-toolkit still offers them, so kvcap does too.
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = _TLS_VERSIONS[tls.min_version]
        context.maximum_version = _TLS_VERSIONS[tls.max_version]
    _apply_ciphers(context, tls)
    # Each file is read once, as every file kvcap did not choose is (a FIFO in its place
    # would hang start-up or a reload in OpenSSL's open; /dev/zero would never end), and
    # OpenSSL loads exactly those bytes from an anonymous memory file.
    with _tls_file(tls.cert_file, "cert_file") as cert, _tls_file(tls.key_file, "key_file") as key:
        # Into a throwaway context: tells a bad certificate apart from a bad key, which
        # load_cert_chain reports alike.
        throwaway = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        _load_certificates(throwaway, cert, tls.cert_file, "cert_file")
        try:
            context.load_cert_chain(cert, key, password=_refuse_encrypted_key)
        except ssl.SSLError as exc:
            problem = (
                "does not match the certificate in cert_file"
                if exc.reason == "KEY_VALUES_MISMATCH"
                else f"holds no private key that loads: {exc}"
            )
            _fail("tls_server_config.key_file", f"{tls.key_file} {problem}", exc)
    if tls.client_ca_file is not None:
        with _tls_file(tls.client_ca_file, "client_ca_file") as client_ca:
            _load_certificates(context, client_ca, tls.client_ca_file, "client_ca_file")
    context.verify_mode = _VERIFY_MODES[tls.client_auth_type]
    context.set_alpn_protocols(["http/1.1"])
    if tls.client_allowed_sans:
        context.sslsocket_class = _allowed_sans_socket(tls.client_allowed_sans)
    return context


def _apply_ciphers(context: ssl.SSLContext, tls: TlsConfig) -> None:
    if tls.prefer_server_cipher_suites:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    names = [GO_CIPHER_SUITES[name] for name in tls.cipher_suites]
    openssl = [name for name in names if name is not None]
    if openssl:
        try:
            context.set_ciphers(":".join(openssl))
        except ssl.SSLError as exc:
            _fail("tls_server_config.cipher_suites", "none of them is available here", exc)
    if len(tls.curve_preferences) == 1:
        # Python's ssl sets one group at most; a single curve is enforced exactly.
        try:
            context.set_ecdh_curve(GO_CURVES[tls.curve_preferences[0]])
        except (ValueError, ssl.SSLError) as exc:
            _fail("tls_server_config.curve_preferences", "not available in this OpenSSL", exc)


def _allowed_sans_socket(allowed: tuple[str, ...]) -> type[ssl.SSLSocket]:
    """An SSLSocket whose handshake fails unless the client certificate has a Subject
    Alternative Name (DNS, IP, e-mail or URI) equal to one in `allowed`."""
    wanted = frozenset(allowed)

    class AllowedSansSocket(ssl.SSLSocket):
        def do_handshake(self, block: bool = False) -> None:
            super().do_handshake(block)
            certificate = self.getpeercert() or {}
            entries: Any = certificate.get("subjectAltName", ())
            names = {str(entry[1]) for entry in entries}
            if not names & wanted:
                raise ssl.SSLError("client certificate has no allowed Subject Alternative Name")

    return AllowedSansSocket


def _parse_tls(document: object, base_dir: Path) -> TlsConfig:
    fields = _mapping(document, "tls_server_config", _TLS_FIELDS)
    cert_file = _required_path(fields, "cert_file", base_dir)
    key_file = _required_path(fields, "key_file", base_dir)
    client_ca_file = _path(fields, "client_ca_file", base_dir)
    client_auth_type = _choice(fields, "client_auth_type", _CLIENT_AUTH_TYPES, "NoClientCert")
    if client_auth_type in _NEEDS_CLIENT_CA and client_ca_file is None:
        _fail("tls_server_config.client_ca_file", f"required with {client_auth_type}")
    # Refused as exporter-toolkit refuses it: whoever wrote a CA expects it to be used.
    if client_auth_type == "NoClientCert" and client_ca_file is not None:
        _fail(
            "tls_server_config.client_auth_type",
            "client_ca_file is set but client certificates are not checked; "
            "use RequireAndVerifyClientCert or VerifyClientCertIfGiven",
        )
    return TlsConfig(
        cert_file=cert_file,
        key_file=key_file,
        client_ca_file=client_ca_file,
        client_auth_type=cast(ClientAuthType, client_auth_type),
        **_tls_options(fields, client_auth_type),
    )


def _tls_options(fields: dict[str, Any], client_auth_type: str) -> dict[str, Any]:
    """The TLS fields beyond files and client auth, checked as exporter-toolkit checks them."""
    where = "tls_server_config"
    min_version = _choice(fields, "min_version", _TLS_VERSION_NAMES, "TLS12")
    max_version = _choice(fields, "max_version", _TLS_VERSION_NAMES, "TLS13")
    if _TLS_VERSION_NAMES.index(min_version) > _TLS_VERSION_NAMES.index(max_version):
        _fail(f"{where}.max_version", f"{max_version} is below min_version {min_version}")
    ciphers = _strings(fields, "cipher_suites", where)
    for name in ciphers:
        if name not in GO_CIPHER_SUITES:
            _fail(f"{where}.cipher_suites", f"unknown cipher suite {name!r}")
    curves = _strings(fields, "curve_preferences", where)
    for name in curves:
        if name not in GO_CURVES:
            _fail(f"{where}.curve_preferences", f"unknown curve {name!r}")
    sans = _strings(fields, "client_allowed_sans", where)
    if sans and client_auth_type not in _SAN_CLIENT_AUTH:
        _fail(
            f"{where}.client_allowed_sans",
            "needs client_auth_type RequireAndVerifyClientCert or RequireAnyClientCert",
        )
    prefer = fields.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        _fail(f"{where}.prefer_server_cipher_suites", "must be true or false")
    return {
        "min_version": cast(TlsVersionName, min_version),
        "max_version": cast(TlsVersionName, max_version),
        "cipher_suites": ciphers,
        "prefer_server_cipher_suites": prefer,
        "curve_preferences": curves,
        "client_allowed_sans": sans,
    }


def _parse_http(document: object) -> tuple[bool, tuple[tuple[str, str], ...]]:
    if document is None:
        return True, ()
    fields = _mapping(document, "http_server_config", _HTTP_FIELDS)
    http2 = fields.get("http2", True)
    if not isinstance(http2, bool):
        _fail("http_server_config.http2", "must be true or false")
    headers_document = fields.get("headers")
    if headers_document is None:
        return http2, ()
    headers = _mapping(headers_document, "http_server_config.headers", tuple(_HEADER_VALUES))
    chosen = []
    for name, value in headers.items():
        where = f"http_server_config.headers.{name}"
        # The type is checked before str(): an alias-expanded list would be rendered whole.
        if not isinstance(value, str | int | float | None):
            _fail(where, "must be one line of text")
        text = "" if value is None else str(value).strip()
        problem = header_value_problem(text)
        if problem is not None:
            _fail(where, problem)
        allowed = _HEADER_VALUES[name]
        if text and allowed is not None and text.lower() not in allowed:
            _fail(where, f"must be one of {', '.join(allowed)}")
        if text:  # blank: unset, as exporter-toolkit reads it
            chosen.append((str(name), text))
    total = sum(len(name) + len(text) + 4 for name, text in chosen)  # ": " and CRLF
    if total > MAX_HEADERS_BYTES:
        _fail("http_server_config.headers", f"{total} bytes in all; at most {MAX_HEADERS_BYTES}")
    return http2, tuple(chosen)


def header_value_problem(text: str) -> str | None:
    """Why `text` cannot be sent as a response header value, None when it can: visible
    ASCII and inner spaces or tabs only (RFC 9110's field-value without obs-text), at most
    MAX_HEADER_VALUE_BYTES. Every response's head is encoded as ASCII, so one character
    past it would fail every answer, /healthz included; CR, LF or NUL would split or end
    the head a client reads."""
    if len(text) > MAX_HEADER_VALUE_BYTES:
        return f"{len(text)} characters; at most {MAX_HEADER_VALUE_BYTES}"
    bad = _NOT_FIELD_VALUE.search(text)
    if bad is not None:
        return (
            f"must be one line of visible ASCII text; character {bad.start() + 1} is "
            f"{bad.group()!a}"
        )
    return None


def _strings(
    fields: dict[str, Any], name: str, where: str, *, paths: bool = False
) -> tuple[str, ...]:
    value = fields.get(name)
    full = f"{where}.{name}" if where else name
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        _fail(full, "must be a list of non-empty strings")
    if paths and not all(v.startswith("/") for v in value):
        _fail(full, "must be a list of paths starting with /")
    return tuple(value)


def _parse_users(document: object) -> dict[str, str]:
    if not isinstance(document, dict):
        _fail("basic_auth_users", "must be a mapping of user name to bcrypt hash")
    users: dict[str, str] = {}
    for name, hashed in document.items():
        if not isinstance(name, str) or not name:
            _fail("basic_auth_users", f"user names must be non-empty strings, got {_shown(name)}")
        if ":" in name:  # basic auth splits "user:password" at the first colon
            _fail(f"basic_auth_users.{_shown(name)}", "user names cannot contain ':'")
        if not isinstance(hashed, str) or not BCRYPT_HASH.fullmatch(hashed):
            # The value is never echoed: it may be a plain-text password put there by mistake.
            _fail(f"basic_auth_users.{_shown(name)}", "must be a bcrypt hash ($2a$, $2b$ or $2y$)")
        users[name] = hashed
    return users


def _mapping(document: object, name: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(document, dict):
        _fail(name or "file", f"must be a mapping with the fields {', '.join(known)}")
    for key in document:
        if key not in known:
            where = f"{name}.{_shown(key)}" if name else _shown(key)
            _fail(where, f"unknown field; expected one of {', '.join(known)}")
    return document


def _required_path(fields: dict[str, Any], name: str, base_dir: Path) -> Path:
    path = _path(fields, name, base_dir)
    if path is None:
        _fail(f"tls_server_config.{name}", "required when tls_server_config is set")
    return path


def _path(fields: dict[str, Any], name: str, base_dir: Path) -> Path | None:
    value = fields.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        _fail(f"tls_server_config.{name}", f"must be a file path, got {_shown(value)}")
    if "\0" in value:  # no file has one; ssl and open() would raise ValueError
        _fail(f"tls_server_config.{name}", "must be a file path, got a NUL byte in it")
    # exporter-toolkit reads relative paths from the config file's folder, not the cwd.
    return base_dir / value


def _choice(fields: dict[str, Any], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = fields.get(name, default)
    if value not in allowed:
        _fail(f"tls_server_config.{name}", f"must be one of {', '.join(allowed)}")
    return str(value)


@contextmanager
def _tls_file(path: Path, name: str) -> Iterator[str]:
    """A path to the bytes `path` held when read (bounded_files): a memory file of this
    process, which nothing can swap for a FIFO between the check and OpenSSL's open."""
    try:
        data = read_regular_file(path, max_bytes=MAX_TLS_FILE_BYTES)
    except (OSError, ValueError, FileRefused) as exc:
        _fail(f"tls_server_config.{name}", f"cannot read {path}: {exc}", exc)
    descriptor = os.memfd_create(f"kvcap-{name}", os.MFD_CLOEXEC)
    try:
        with open(descriptor, "wb", closefd=False) as memory:
            memory.write(data)
        yield f"/proc/self/fd/{descriptor}"
    finally:
        os.close(descriptor)


def _load_certificates(context: ssl.SSLContext, loadable: str, path: Path, name: str) -> None:
    """The PEM certificates of `loadable` (the memory file of `path`) into `context`'s
    trust store; ConfigError naming `name` where none loads."""
    try:
        context.load_verify_locations(cafile=loadable)
    except ssl.SSLError as exc:
        _fail(f"tls_server_config.{name}", f"no PEM certificate can be loaded from {path}", exc)


def _refuse_encrypted_key() -> NoReturn:
    # Without a callback OpenSSL would prompt for the passphrase on the terminal.
    _fail("tls_server_config.key_file", "is encrypted; kvcap needs an unencrypted key")


def _shown(key: object) -> str:
    """A key of the file as an error message may show it: one short line of ASCII."""
    text = key if isinstance(key, str) and _PRINTABLE_KEY.fullmatch(key) else ascii(key)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _fail(where: str, problem: str, cause: BaseException | None = None) -> NoReturn:
    raise ConfigError(f"web config {where}: {problem}") from cause
