"""Reading a model's config.json: every bad file is a ConfigError naming it, never a crash."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.errors import ConfigError
from exporter.model_config import load_model_config


def test_a_model_directory_or_the_file_itself(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    assert load_model_config(tmp_path) == {"model_type": "llama"}
    assert load_model_config(tmp_path / "config.json") == {"model_type": "llama"}


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{", "not valid JSON"),
        (b"\xff{}", "not valid JSON"),  # not UTF-8
        (b'{"a": ' + b"9" * 5000 + b"}", "not valid JSON"),  # int() refuses 4,300+ digits
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),  # deeper than json recurses
        (b"[1, 2]", "must hold a JSON object"),
        (b'{"architectures": ["X\\ud800"]}', "lone UTF-16 surrogate"),
    ],
    ids=["truncated", "not-utf8", "long-int", "deep", "not-an-object", "lone-surrogate"],
)
def test_a_bad_file_is_a_config_error_naming_it(tmp_path: Path, content: bytes, why: str) -> None:
    file = tmp_path / "config.json"
    file.write_bytes(content)
    with pytest.raises(ConfigError, match=why) as refused:
        load_model_config(tmp_path)
    assert str(file) in str(refused.value)


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_model_config(tmp_path / "config.json")
