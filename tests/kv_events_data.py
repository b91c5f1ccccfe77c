"""KV event fixtures (tests/fixtures/kv_events/) and what a test expects of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "kv_events"
# The live recordings: a tiny Llama on vLLM 0.32.0 (CPU), --block-size 32 and a pool of
# --num-gpu-blocks-override 40; the second recording continues the first's stream.
SHARED_PREFIX = "llama-0.32.0-shared-prefix.msgpack"
EVICTIONS = "llama-0.32.0-evictions.msgpack"
LIVE_BLOCK_SIZE = 32
LIVE_POOL_BLOCKS = 40


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = msgspec.msgpack.decode((FIXTURES / name).read_bytes())
    return document


def frames(name: str) -> list[list[bytes]]:
    return [list(frame) for frame in load(name)["frames"]]


def distinct_full_blocks(prompts: list[list[int]], block_size: int) -> int:
    """Blocks a prefix cache stores for these prompts: one per distinct full-block prefix
    (a block's hash covers every token before it, so equal blocks share all of those)."""
    return len(
        {
            tuple(tokens[: (i + 1) * block_size])
            for tokens in prompts
            for i in range(len(tokens) // block_size)
        }
    )
