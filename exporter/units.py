"""Parsing of human-readable sizes and counts given on the command line."""

from __future__ import annotations

import math
import re

from exporter.errors import ConfigError

_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_DECIMAL = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT])?(i?B|i)?\s*$")
# No byte size or token count has more digits than this (2**64 has 20); a longer number is
# refused before int() (which refuses over 4,300 digits with a ValueError of its own).
_MAX_DIGITS = 20


def parse_size(text: str) -> int:
    """Bytes from `42949672960`, `40GiB`, `40G`, `40Gi`, `40GB` or `40g`.

    As vLLM reads sizes: an upper-case unit or an `i` means powers of 1024
    (`40G` = 40 GiB); a lower-case unit or `GB` means powers of 1000.
    """
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(f"not a size: {text!r} (examples: 42949672960, 40GiB, 40G)")
    number, unit, suffix = match.groups()
    if len(number) > _MAX_DIGITS:
        raise ConfigError(f"{text[:40]!r}... is too large")
    if unit is None:
        if suffix not in (None, "B"):
            raise ConfigError(f"not a size: {text!r}")
        if "." in number:
            raise ConfigError(f"a size in bytes must be a whole number: {text!r}")
        return int(number)
    binary = suffix in ("i", "iB") or (unit.isupper() and suffix != "B")
    scale = (_BINARY if binary else _DECIMAL)[unit.upper()]
    value = float(number) * scale
    if not math.isfinite(value):
        raise ConfigError(f"{text!r} is too large")
    if value != int(value):
        raise ConfigError(f"{text!r} is not a whole number of bytes")
    return int(value)


def parse_count(text: str) -> int:
    """A token or block count: `32768`, `32k` (32000), `32K` (32768) or `-1`."""
    stripped = text.strip()
    if re.fullmatch(r"-?\d+", stripped):
        if len(stripped.lstrip("-")) > _MAX_DIGITS:
            raise ConfigError(f"{stripped[:40]!r}... is too large")
        return int(stripped)
    if stripped.endswith(("B", "i", "iB")):
        raise ConfigError(f"not a count: {text!r}")
    return parse_size(stripped)
