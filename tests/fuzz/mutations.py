"""Strategies shared by the fuzz tests: garbage values and mutations of real documents.

A mutation starts from a real input (a golden config.json, a recorded exposition, vLLM's
own ready-response bytes) and breaks it a little: deletes a key, replaces a value with one
of the wrong type or a hostile number, inserts garbage, flips bytes. Inputs that are almost
right reach far deeper into a parser than random ones.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

from exporter.handshake_wire import BYE_TOPIC, READY_TOPIC, encode, ready_message
from tools.handshake_data import ready_for_rank

# Numbers that break arithmetic: zero, signs, the edges of machine integers, values far
# past anything real, and the floats JSON parsers accept (Python's reads NaN and Infinity).
HOSTILE_NUMBERS: tuple[Any, ...] = (
    0,
    -1,
    1,
    2,
    3,
    7,
    2**31,
    2**63,
    2**64 + 1,
    10**30,
    -(10**30),
    0.5,
    -0.0,
    1e-300,
    1e300,
    math.inf,
    -math.inf,
    math.nan,
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(HOSTILE_NUMBERS),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=12),
)

# Any JSON-like value, nested a few levels.
garbage: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=8,
)

Path = tuple[Any, ...]


def paths(document: Any, prefix: Path = ()) -> Iterator[Path]:
    """The path of every value inside a JSON-like document (not the root)."""
    if isinstance(document, dict):
        items: Any = document.items()
    elif isinstance(document, list):
        items = enumerate(document)
    else:
        return
    for key, value in items:
        yield (*prefix, key)
        yield from paths(value, (*prefix, key))


def containers(document: Any, prefix: Path = ()) -> Iterator[Path]:
    """The path of every mapping inside a document, the root included."""
    if isinstance(document, dict):
        yield prefix
        for key, value in document.items():
            yield from containers(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            yield from containers(value, (*prefix, index))


def _at(document: Any, path: Path) -> Any:
    for key in path:
        document = document[key]
    return document


def near(value: Any) -> st.SearchStrategy[Any]:
    """Values close to `value` that a careless edit or a broken writer could produce."""
    if isinstance(value, bool):
        return st.sampled_from([not value, int(value), str(value).lower(), None])
    if isinstance(value, int):
        return st.sampled_from(
            [0, -value, value + 1, value - 1, value * 1024, value // 3, value + 0.5, str(value)]
        )
    if isinstance(value, float):
        whole = int(value) if math.isfinite(value) else 0
        return st.sampled_from([0.0, -value, value * 1e6, whole, math.nan, str(value)])
    if isinstance(value, str):
        return st.sampled_from(["", value.upper(), value[:-1], value + "x", f"torch.{value}"])
    if isinstance(value, list):
        return st.sampled_from([[], value[:1], value * 2, value[::-1], {"0": value}])
    return garbage


@st.composite
def mutated(
    draw: st.DrawFn,
    document: Any,
    *,
    keys: tuple[str, ...] = (),
    values: st.SearchStrategy[Any] = garbage,
    max_mutations: int = 5,
) -> Any:
    """`document` after one to `max_mutations` random edits.

    `keys` are names worth inserting (fields the reader looks for); `values` is what an
    inserted or replaced value is drawn from, besides values near the original.
    """
    result = copy.deepcopy(document)
    for _ in range(draw(st.integers(min_value=1, max_value=max_mutations))):
        where = sorted(paths(result), key=repr)
        operation = draw(st.sampled_from(["delete", "replace", "near", "insert"]))
        if operation == "insert" or not where:
            parents = sorted(containers(result), key=repr)
            if not parents:
                return draw(values)
            parent = _at(result, draw(st.sampled_from(parents)))
            name = draw(st.sampled_from(keys) | st.text(max_size=8)) if keys else draw(st.text())
            parent[name] = draw(values)
            continue
        path = draw(st.sampled_from(where))
        parent = _at(result, path[:-1])
        if operation == "delete":
            del parent[path[-1]]
        elif operation == "near":
            parent[path[-1]] = draw(near(parent[path[-1]]))
        else:
            parent[path[-1]] = draw(values)
    return result


@st.composite
def mutated_bytes(draw: st.DrawFn, data: bytes, *, max_mutations: int = 8) -> bytes:
    """`data` with bytes flipped, replaced, cut, duplicated or inserted."""
    buffer = bytearray(data)
    for _ in range(draw(st.integers(min_value=1, max_value=max_mutations))):
        operation = draw(st.sampled_from(["flip", "set", "cut", "insert", "duplicate"]))
        if not buffer:
            buffer += draw(st.binary(min_size=1, max_size=8))
            continue
        index = draw(st.integers(min_value=0, max_value=len(buffer) - 1))
        if operation == "flip":
            buffer[index] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif operation == "set":
            buffer[index] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xC0, 0xC1, 0xDC, 0xDE, 0xFF]))
        elif operation == "cut":
            end = draw(st.integers(min_value=index, max_value=len(buffer)))
            del buffer[index:end]
        elif operation == "insert":
            buffer[index:index] = draw(st.binary(min_size=1, max_size=8))
        else:
            end = draw(st.integers(min_value=index, max_value=min(len(buffer), index + 32)))
            buffer[index:index] = buffer[index:end]
    return bytes(buffer)


def handshake_frames(seed: int, count: int) -> Iterator[list[bytes]]:
    """Random and mutated frames: wrong counts, truncated and bit-flipped msgpack, wrong
    types, msgpack headers that claim huge lengths, and now and then a valid message."""
    rng = random.Random(seed)
    valid = ready_for_rank(0)
    huge = [
        b"\xdb\xff\xff\xff\xf0",
        b"\xdd\xff\xff\xff\xff",
        b"\xdf\x7f\xff\xff\xff",
        b"\xc6\xff\xff\xff\xff",
    ]
    wrong_types = [
        encode({"max_model_len": [], "num_gpu_blocks": 1, "data_parallel_rank": 0}),
        encode([1, 2, 3]),
        encode("ready"),
        encode({"engine_index": "zero"}),
    ]
    for _ in range(count):
        kind = rng.randrange(8)
        if kind == 0:
            frames = [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 5))]
        elif kind == 1:
            frames = [READY_TOPIC, valid[: rng.randrange(len(valid))]]
        elif kind == 2:
            flipped = bytearray(valid)
            for _ in range(rng.randrange(1, 8)):
                flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
            frames = [READY_TOPIC, bytes(flipped)]
        elif kind == 3:
            frames = [rng.choice([READY_TOPIC, BYE_TOPIC]), rng.choice(huge)]
        elif kind == 4:
            frames = [rng.choice([READY_TOPIC, BYE_TOPIC]), rng.choice(wrong_types)]
        elif kind == 5:
            frames = [READY_TOPIC] * rng.randrange(4, 7)
        elif kind == 6:
            frames = [READY_TOPIC, valid, rng.randbytes(rng.randrange(1, 32))]
        else:
            frames = ready_message(ready_for_rank(rng.randrange(4), str(rng.randrange(3))))
        yield frames
