"""The exporter-toolkit web config file (--web.config.file): TLS, basic auth, SSL context."""

from __future__ import annotations

import re
import ssl
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, NoReturn, cast, get_args

import yaml

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
_TOP_LEVEL_FIELDS: Final = ("tls_server_config", "basic_auth_users")
_TLS_FIELDS: Final = ("cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version")
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


def load_web_config(path: Path | str) -> WebConfig:
    """Read and check a web config file, including that its certificate and keys load."""
    config = read_web_config_file(path)
    if config.tls is not None:
        build_ssl_context(config.tls)
    return config


def read_web_config_file(path: Path | str) -> WebConfig:
    """Read a web config file and check its schema, without opening the TLS files."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"web config file {path}: cannot read it: {exc}") from exc
    return parse_web_config(text, base_dir=path.parent)


def parse_web_config(text: str, *, base_dir: Path) -> WebConfig:
    """Parse the YAML text of a web config file; relative paths are taken from `base_dir`."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = ""
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
            where = f" at line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1}"
        problem = exc.problem if isinstance(exc, yaml.MarkedYAMLError) else None
        raise ConfigError(f"web config: not valid YAML{where}: {problem or exc}") from exc
    except Exception as exc:
        # PyYAML's constructors raise plain Python errors for malformed tagged scalars
        # (ValueError for a bad date, AttributeError for an empty !!timestamp, KeyError for
        # an empty !!bool) and RecursionError for deep nesting: bad input all the same.
        raise ConfigError(f"web config: not valid YAML: {type(exc).__name__}: {exc}") from exc
    if document is None:  # an empty file, as exporter-toolkit allows
        return WebConfig()
    fields = _mapping(document, "", _TOP_LEVEL_FIELDS)
    tls_document = fields.get("tls_server_config")
    users_document = fields.get("basic_auth_users")
    return WebConfig(
        tls=None if tls_document is None else _parse_tls(tls_document, base_dir),
        basic_auth_users=MappingProxyType(
            {} if users_document is None else _parse_users(users_document)
        ),
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
    _check_certificates_load(tls.cert_file, "cert_file")
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file, password=_refuse_encrypted_key)
    except ssl.SSLError as exc:
        problem = (
            "does not match the certificate in cert_file"
            if exc.reason == "KEY_VALUES_MISMATCH"
            else f"holds no private key that loads: {exc}"
        )
        _fail("tls_server_config.key_file", f"{tls.key_file} {problem}", exc)
    except OSError as exc:
        _fail("tls_server_config.key_file", f"cannot read {tls.key_file}: {exc}", exc)
    if tls.client_ca_file is not None:
        _check_certificates_load(tls.client_ca_file, "client_ca_file")
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except OSError as exc:  # replaced since the check a moment ago; ssl.SSLError included
            _fail("tls_server_config.client_ca_file", f"cannot load {tls.client_ca_file}", exc)
    context.verify_mode = _VERIFY_MODES[tls.client_auth_type]
    context.set_alpn_protocols(["http/1.1"])
    return context


def _parse_tls(document: object, base_dir: Path) -> TlsConfig:
    fields = _mapping(document, "tls_server_config", _TLS_FIELDS)
    cert_file = _required_path(fields, "cert_file", base_dir)
    key_file = _required_path(fields, "key_file", base_dir)
    client_ca_file = _path(fields, "client_ca_file", base_dir)
    client_auth_type = _choice(fields, "client_auth_type", _CLIENT_AUTH_TYPES, "NoClientCert")
    min_version = _choice(fields, "min_version", _TLS_VERSION_NAMES, "TLS12")
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
        min_version=cast(TlsVersionName, min_version),
    )


def _parse_users(document: object) -> dict[str, str]:
    if not isinstance(document, dict):
        _fail("basic_auth_users", "must be a mapping of user name to bcrypt hash")
    users: dict[str, str] = {}
    for name, hashed in document.items():
        if not isinstance(name, str) or not name:
            _fail("basic_auth_users", f"user names must be non-empty strings, got {name!r}")
        if ":" in name:  # basic auth splits "user:password" at the first colon
            _fail(f"basic_auth_users.{name}", "user names cannot contain ':'")
        if not isinstance(hashed, str) or not BCRYPT_HASH.fullmatch(hashed):
            # The value is never echoed: it may be a plain-text password put there by mistake.
            _fail(f"basic_auth_users.{name}", "must be a bcrypt hash ($2a$, $2b$ or $2y$)")
        users[name] = hashed
    return users


def _mapping(document: object, name: str, known: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(document, dict):
        _fail(name or "file", f"must be a mapping with the fields {', '.join(known)}")
    for key in document:
        if key not in known:
            where = f"{name}.{key}" if name else str(key)
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
        _fail(f"tls_server_config.{name}", f"must be a file path, got {value!r}")
    if "\0" in value:  # no file has one; ssl and open() would raise ValueError
        _fail(f"tls_server_config.{name}", "must be a file path, got a NUL byte in it")
    # exporter-toolkit reads relative paths from the config file's folder, not the cwd.
    return base_dir / value


def _choice(fields: dict[str, Any], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = fields.get(name, default)
    if value not in allowed:
        _fail(f"tls_server_config.{name}", f"must be one of {', '.join(allowed)}")
    return str(value)


def _check_certificates_load(path: Path, name: str) -> None:
    # Loading into a throwaway context tells a bad certificate apart from a bad key, which
    # load_cert_chain reports alike.
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        _fail(f"tls_server_config.{name}", f"no PEM certificate can be loaded from {path}", exc)
    except OSError as exc:
        _fail(f"tls_server_config.{name}", f"cannot read {path}: {exc}", exc)


def _refuse_encrypted_key() -> NoReturn:
    # Without a callback OpenSSL would prompt for the passphrase on the terminal.
    _fail("tls_server_config.key_file", "is encrypted; kvcap needs an unencrypted key")


def _fail(where: str, problem: str, cause: BaseException | None = None) -> NoReturn:
    raise ConfigError(f"web config {where}: {problem}") from cause
