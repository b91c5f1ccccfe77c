"""Sizes and counts as the command line accepts them."""

from __future__ import annotations

import pytest

from exporter.errors import ConfigError
from exporter.units import parse_count, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42949672960", 42949672960),
        ("40GiB", 40 * 2**30),
        ("40Gi", 40 * 2**30),
        ("40G", 40 * 2**30),
        ("40GB", 40 * 10**9),
        ("40g", 40 * 10**9),
        ("1.5GiB", 3 * 2**29),
        ("512MiB", 512 * 2**20),
        ("2T", 2 * 2**40),
        (" 7 ", 7),
        ("100B", 100),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "forty", "40X", "-1G", "1.5", "40 GiBs", "0.3B"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"), [("32768", 32768), ("-1", -1), ("32k", 32000), ("32K", 32768)]
)
def test_parse_count(text: str, expected: int) -> None:
    assert parse_count(text) == expected


def test_parse_count_rejects_byte_units() -> None:
    with pytest.raises(ConfigError):
        parse_count("32KiB")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("250ms", 0.25), ("1m", 60.0), ("1m30s", 90.0), ("2h", 7200.0), ("5", 5.0),
     ("0.5", 0.5), ("1.5s", 1.5), ("1d", 86400.0)],
)  # fmt: skip
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "5 s", "5x", "s", "1m5", "inf", "nan", "ms5"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="not a duration"):
        parse_duration(text)
