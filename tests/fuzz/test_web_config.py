"""--web.config.file: any text gives a WebConfig or a ConfigError, never a traceback.

`kvcap-exporter serve` turns a ConfigError into one line on stderr and exit code 1; any
other exception is a traceback at startup. The inputs: arbitrary text, YAML-looking text,
and real web configs (TLS with every field, bcrypt users) mutated and dumped back to YAML.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from exporter.errors import ConfigError
from exporter.web import BCRYPT_HASH, WebConfig, parse_web_config
from tests.fuzz.mutations import garbage, mutated
from tests.support.certificates import certificate, new_key, write_certificate, write_key
from tests.web.conftest import served_config

HASH = bcrypt.hashpw(b"wonderland", bcrypt.gensalt(rounds=4)).decode()
BASE_DIR = Path("/etc/kvcap")
VALID: dict[str, Any] = {
    "tls_server_config": {
        "cert_file": "server.pem",
        "key_file": "server-key.pem",
        "client_ca_file": "ca.pem",
        "client_auth_type": "RequireAndVerifyClientCert",
        "min_version": "TLS13",
    },
    "basic_auth_users": {"alice": HASH, "bob": HASH},
}
KEYS = (
    "tls_server_config",
    "basic_auth_users",
    "cert_file",
    "key_file",
    "client_ca_file",
    "client_auth_type",
    "min_version",
    "alice",
)
# What a field may be set to: the right kind of value, a near miss, or garbage.
VALUES = st.one_of(
    garbage,
    st.sampled_from(
        [
            "NoClientCert",
            "RequestClientCert",
            "RequireAnyClientCert",
            "VerifyClientCertIfGiven",
            "TLS10",
            "TLS14",
            "tls13",
            "server.pem",
            "server-key.pem",
            "ca.pem",
            "missing.pem",
            ".",
            "..",
            "/",
            "",
            HASH,
            HASH[:-1],
            HASH.replace("$2b$", "$2x$"),
            "alice:secret",
        ]
    ),
)
# YAML's syntax characters, tags and scalars its resolvers treat specially.
YAML_PIECES = st.sampled_from(
    [
        ":",
        "- ",
        "? ",
        "{",
        "}",
        "[",
        "]",
        ",",
        "&a ",
        "*a",
        "!!str ",
        "!!int ",
        "!!float ",
        "!!binary ",
        "!!timestamp ",
        "!!bool ",
        "!!null ",
        "!!set ",
        "!!omap ",
        "!!python/object:os.system ",
        "%YAML 1.1\n---\n",
        "---\n",
        "...\n",
        "|\n",
        ">\n",
        "#",
        "'",
        '"',
        "\\",
        "\t",
        "\n",
        "  ",
        "~",
        "null",
        "yes",
        "0x1F",
        "0o17",
        "1_000",
        "1e400",
        ".nan",
        "2001-12-14",
        "2001-12-14t21:59:43.10-05:00",
        "<<",
        "\ufeff",
        "\x00",
        "\x85",
    ]
)
yaml_like = st.lists(YAML_PIECES | st.text(max_size=6), max_size=24).map("".join)


def parse(text: str) -> WebConfig | None:
    """The parsed config, or None when it was refused with a ConfigError."""
    try:
        return parse_web_config(text, base_dir=BASE_DIR)
    except ConfigError as error:
        refusal = str(error)
    assert refusal.startswith("web config"), refusal  # it names where the problem is
    return None


def check_config(config: WebConfig) -> None:
    """What a WebConfig promises the server: only checked values."""
    for name, hashed in config.basic_auth_users.items():
        assert isinstance(name, str)
        assert name
        assert ":" not in name
        assert BCRYPT_HASH.fullmatch(hashed)
    if config.tls is not None:
        for path in config.tls.files:
            assert isinstance(path, Path)
            assert path.is_absolute()
        assert config.tls.min_version in ("TLS10", "TLS11", "TLS12", "TLS13")
        if config.tls.client_auth_type in (
            "RequireAnyClientCert",
            "VerifyClientCertIfGiven",
            "RequireAndVerifyClientCert",
        ):
            assert config.tls.client_ca_file is not None


@given(text=st.text())
def test_arbitrary_text(text: str) -> None:
    config = parse(text)
    if config is not None:
        check_config(config)


@given(text=yaml_like)
def test_yaml_like_text(text: str) -> None:
    config = parse(text)
    if config is not None:
        check_config(config)


@given(document=mutated(VALID, keys=KEYS, values=VALUES), flow=st.booleans())
def test_mutated_web_configs(document: Any, flow: bool) -> None:
    text = yaml.safe_dump(document, default_flow_style=flow, allow_unicode=True)
    config = parse(text)
    if config is not None:
        check_config(config)


def test_the_valid_config_parses() -> None:
    config = parse(yaml.safe_dump(VALID))
    assert config is not None
    check_config(config)
    assert config.tls is not None
    assert config.tls.client_ca_file == BASE_DIR / "ca.pem"
    assert dict(config.basic_auth_users) == {"alice": HASH, "bob": HASH}


# --- the file on disk, TLS files loaded, as the server starts with it ------------------


def _write_tls_files(folder: Path) -> None:
    key = new_key()
    ca = certificate("kvcap fuzz", key)
    write_certificate(folder / "server.pem", ca)
    write_certificate(folder / "ca.pem", ca)
    write_key(folder / "server-key.pem", key)


@pytest.fixture(scope="module")
def tls_folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kvcap-fuzz-web-") as name:
        folder = Path(name)
        _write_tls_files(folder)
        yield folder


def load(folder: Path, content: bytes) -> WebConfig | None:
    path = folder / "web.yml"
    path.write_bytes(content)
    try:
        return served_config(path)
    except ConfigError:
        return None


def test_the_valid_config_loads(tls_folder: Path) -> None:
    config = load(tls_folder, yaml.safe_dump(VALID).encode())
    assert config is not None
    assert config.tls is not None


@given(document=mutated(VALID, keys=KEYS, values=VALUES))
def test_mutated_web_config_files_load_or_refuse(tls_folder: Path, document: Any) -> None:
    """Every certificate, key and CA file really loaded, whichever fields were broken."""
    content = yaml.safe_dump(document, allow_unicode=True).encode()
    config = load(tls_folder, content)
    if config is not None:
        check_config(config)


@given(content=st.binary(max_size=200))
def test_arbitrary_bytes_in_the_file(tls_folder: Path, content: bytes) -> None:
    config = load(tls_folder, content)
    if config is not None:
        check_config(config)


# --- the bugs the fuzzer found, minimal inputs ------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "2019-02-30",  # PyYAML's timestamp resolver: ValueError, day is out of range
        "a: 2019-13-01",
        "1" * 5000,  # int() of more than 4300 digits: ValueError
        "!!float x",  # an explicit tag the constructor cannot apply: ValueError
        "!!int ",  # an empty scalar with an int or float tag: IndexError
        "[" * 1000,  # PyYAML's recursive composer: RecursionError
    ],
    ids=["bad-date", "bad-month", "long-int", "float-tag", "empty-int-tag", "deep-nesting"],
)
def test_yaml_errors_that_are_not_yaml_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_web_config(text, base_dir=BASE_DIR)


@pytest.mark.parametrize("text", ["!!timestamp ", "!!bool ", "a: !!timestamp "])
def test_yaml_errors_the_first_fix_missed(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_web_config(text, base_dir=BASE_DIR)


def test_a_nul_byte_in_a_file_path(tls_folder: Path) -> None:
    path = tls_folder / "nul.yml"
    path.write_text('tls_server_config: {cert_file: "a\\0b", key_file: server-key.pem}\n')
    with pytest.raises(ConfigError):
        served_config(path)
