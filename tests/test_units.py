"""Sizes and counts as the command line accepts them."""

from __future__ import annotations

import pytest

from exporter.errors import ConfigError
from exporter.units import parse_count, parse_size


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
