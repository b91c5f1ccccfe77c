"""Hostile msgpack shapes, as raw bytes: deep nesting, headers that claim huge lengths,
extreme numbers and values of the wrong type, alone or spliced into a real document.

msgspec decodes what Python's msgpack cannot even encode (a 2**32-1 element header over
five bytes, a 100,000-deep array), so these are written byte by byte.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Mapping
from typing import Any

import msgspec


def _nested_arrays(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


def _nested_maps(depth: int) -> bytes:
    return b"\x81\xa1k" * depth + b"\xc0"


# Headers that announce far more than follows: arrays, maps, strings, binaries, extensions.
HUGE_HEADERS = (
    b"\xdd\xff\xff\xff\xff",  # array32 of 4 G elements
    b"\xdc\xff\xff",  # array16 of 65,535
    b"\xdf\xff\xff\xff\xff",  # map32
    b"\xde\xff\xff",  # map16
    b"\xdb\xff\xff\xff\xff",  # str32
    b"\xc6\xff\xff\xff\xff",  # bin32
    b"\xc9\xff\xff\xff\xff\x01",  # ext32
    b"\xdd\x00\x01\x00\x00" + b"\xc0" * 65536,  # array32 of 65,536 nils, all there
)

EXTREME_NUMBERS = (
    b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff",  # uint64 max
    b"\xd3\x80\x00\x00\x00\x00\x00\x00\x00",  # int64 min
    b"\xcf\x80\x00\x00\x00\x00\x00\x00\x00",  # 2**63
    struct.pack(">Bd", 0xCB, float("nan")),
    struct.pack(">Bd", 0xCB, float("inf")),
    struct.pack(">Bd", 0xCB, -1e308),
    struct.pack(">Bd", 0xCB, 5e-324),
    struct.pack(">Bf", 0xCA, float("-inf")),
    b"\xd0\x80",  # int8 -128
    b"\xff",  # fixint -1
)

WRONG_TYPES = (
    b"\xc0",  # nil
    b"\xc2",  # false
    b"\xc3",  # true
    b"\xa0",  # ""
    b"\xa4five",
    b"\xc4\x02\x00\x01",  # bin
    b"\xd4\x01\x00",  # fixext 1
    b"\xd6\xff\x00\x00\x00\x00",  # the timestamp extension
    b"\x90",  # []
    b"\x80",  # {}
    b"\x92\x01\x02",
    b"\x81\x01\x02",  # a map with an integer key
    b"\xc1",  # the one byte msgpack never uses
)


def hostile_value(rng: random.Random) -> bytes:
    """One msgpack value of a hostile shape."""
    kind = rng.randrange(4)
    if kind == 0:
        depth = rng.choice([64, 512, 1024, 10_000, 100_000])
        return (_nested_arrays if rng.randrange(2) else _nested_maps)(depth)
    if kind == 1:
        return rng.choice(HUGE_HEADERS)
    if kind == 2:
        return rng.choice(EXTREME_NUMBERS)
    return rng.choice(WRONG_TYPES)


def _map_header(size: int) -> bytes:
    return bytes([0x80 | size]) if size < 16 else b"\xde" + size.to_bytes(2, "big")


def spliced(document: Mapping[str, Any], rng: random.Random, keys: tuple[str, ...]) -> bytes:
    """`document` as a msgpack map with one to three fields (of `keys`, present or not)
    set to hostile values, the others encoded as they are."""
    chosen = {rng.choice(keys): hostile_value(rng) for _ in range(rng.randrange(1, 4))}
    fields = {key: msgspec.msgpack.encode(value) for key, value in document.items()}
    fields.update(chosen)
    body = b"".join(msgspec.msgpack.encode(key) + value for key, value in fields.items())
    return _map_header(len(fields)) + body
