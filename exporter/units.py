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


_COUNT_EXAMPLES = "131072, 128k (128000), 128K (131072)"


def parse_count(text: str) -> int:
    """A token or block count: `32768`, `32k` (32000), `32K` (32768) or `-1`."""
    stripped = text.strip()
    if re.fullmatch(r"-?\d+", stripped):
        if len(stripped.lstrip("-")) > _MAX_DIGITS:
            raise ConfigError(f"{stripped[:40]!r}... is too large")
        return int(stripped)
    if stripped.endswith(("B", "i", "iB")):
        raise ConfigError(f"not a count: {text!r} (examples: {_COUNT_EXAMPLES})")
    try:
        return parse_size(stripped)
    except ConfigError:
        raise ConfigError(f"not a count: {text!r} (examples: {_COUNT_EXAMPLES})") from None


# Prometheus' duration units (model.ParseDuration), largest first.
_DURATION_UNITS = {
    "y": 365 * 86400.0,
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 0.001,
}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|[ywdhms])")


def parse_duration(text: str) -> float:
    """Seconds from a Prometheus-style duration (`5s`, `250ms`, `1m`, `1m30s`) or plain
    seconds (`5`, `0.5`)."""
    stripped = text.strip()
    try:
        seconds = float(stripped)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise ConfigError(f"not a duration: {text!r}")
        return seconds
    parts = _DURATION.findall(stripped)
    if not parts or "".join(number + unit for number, unit in parts) != stripped:
        raise ConfigError(f"not a duration: {text!r} (examples: 5s, 250ms, 1m, 1m30s, 2.5)")
    return sum(float(number) * _DURATION_UNITS[unit] for number, unit in parts)


def format_duration(seconds: float) -> str:
    """`5.0` -> `5s`, `0.25` -> `250ms`, `90.0` -> `90s`: how --help shows a default."""
    if seconds < 1 and seconds * 1000 == int(seconds * 1000):
        return f"{int(seconds * 1000)}ms"
    return f"{seconds:g}s"


def format_size(size_bytes: int) -> str:
    """`8388608` -> `8MiB`: the largest binary unit that divides it, else plain bytes."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes and size_bytes % scale == 0:
            return f"{size_bytes // scale}{unit}"
    return str(size_bytes)
