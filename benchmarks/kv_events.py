"""KV events: block events decoded and applied per second on one core, and bytes per
tracked block, against msgspec.msgpack.decode of the same batches in the same run.

The stream has the shape a live vLLM 0.32.0 sends (tests/fixtures/kv_events): one batch
per scheduler step, each a BlockStored of 16 new blocks (32 tokens each, their token ids
included, 64-bit hashes) and, once the pool is full, BlockRemoved events for as many old
ones. A block event is one hash stored or removed. Both event shapes are measured: maps
(vLLM 0.32.0) and arrays by position (array_like releases).
Run: .venv/bin/python -m benchmarks.kv_events
"""

from __future__ import annotations

import gc
import random
import time
import tracemalloc

import msgspec

from benchmarks.common import Row, print_rows
from exporter.kv_events_wire import BatchDecoder
from exporter.prefix_cache import EngineResidency

BLOCKS_PER_STEP = 16
BLOCK_SIZE = 32
POOL_BLOCKS = 100_000
STEPS = 20_000
MEMORY_BLOCKS = 1_000_000
TARGET_EVENTS_PER_S = 500_000
TARGET_BYTES_PER_BLOCK = 100


def stream(steps: int, *, by_name: bool, pool: int, seed: int = 16) -> tuple[list[bytes], int]:
    """Encoded batches and the number of block events in them."""
    rng = random.Random(seed)
    resident: list[int] = []
    payloads, block_events = [], 0
    tokens = [rng.randrange(512) for _ in range(BLOCKS_PER_STEP * BLOCK_SIZE)]
    for step in range(steps):
        hashes = [rng.getrandbits(64) for _ in range(BLOCKS_PER_STEP)]
        events: list[object] = []
        if len(resident) + len(hashes) > pool:
            evicted, resident = resident[: len(hashes)], resident[len(hashes) :]
            events.extend(_removed(h, by_name) for h in evicted)  # vLLM: one per block
            block_events += len(evicted)
        events.append(_stored(hashes, tokens, by_name))
        resident.extend(hashes)
        block_events += len(hashes)
        payloads.append(msgspec.msgpack.encode([1.7e9 + step * 0.01, events, 0]))
    return payloads, block_events


def _stored(hashes: list[int], tokens: list[int], by_name: bool) -> object:
    fields = {
        "block_hashes": hashes,
        "parent_block_hash": hashes[0] ^ 1,
        "token_ids": tokens,
        "block_size": BLOCK_SIZE,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [None] * len(hashes),
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    return {"type": "BlockStored", **fields} if by_name else ["BlockStored", *fields.values()]


def _removed(block_hash: int, by_name: bool) -> object:
    if by_name:
        return {
            "type": "BlockRemoved",
            "block_hashes": [block_hash],
            "medium": "GPU",
            "group_idx": 0,
        }
    return ["BlockRemoved", [block_hash], "GPU", 0]


def best_of(func: object, repeats: int = 3) -> float:
    timings = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        func()  # type: ignore[operator]
        timings.append(time.perf_counter() - start)
    return min(timings)


def throughput(by_name: bool) -> tuple[float, float]:
    """(block events/s applied, block events/s of raw msgspec decode alone)."""
    payloads, block_events = stream(STEPS, by_name=by_name, pool=POOL_BLOCKS)

    def ours() -> None:
        residency = EngineResidency("0")
        residency.pool_blocks = POOL_BLOCKS
        decode, apply = BatchDecoder().decode, residency.apply
        for payload in payloads:
            apply(decode(payload))

    def raw() -> None:
        decode = msgspec.msgpack.decode
        for payload in payloads:
            decode(payload)

    return block_events / best_of(ours), block_events / best_of(raw)


def bytes_per_block() -> tuple[float, float]:
    """(bytes per tracked block, bytes per block of holding the raw decoded batches)."""
    payloads, _ = stream(MEMORY_BLOCKS // BLOCKS_PER_STEP, by_name=True, pool=MEMORY_BLOCKS)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    residency = EngineResidency("0")
    residency.pool_blocks = MEMORY_BLOCKS
    decoder = BatchDecoder()
    for payload in payloads:
        residency.apply(decoder.decode(payload))
    gc.collect()
    ours = tracemalloc.get_traced_memory()[0] - before
    tracked = residency.view().pools[0].resident_blocks
    del residency
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    kept = [msgspec.msgpack.decode(p) for p in payloads]
    raw = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del kept
    return ours / tracked, raw / tracked


def rows() -> list[Row]:
    out = []
    for by_name, shape in ((True, "maps, vLLM 0.32"), (False, "arrays by position")):
        ours, raw = throughput(by_name)
        out.append(
            Row(
                f"kv_events: block events decoded+applied ({shape})",
                ours,
                "events/s",
                baseline=raw,
                baseline_name="msgspec.msgpack.decode alone",
                target=f">= {TARGET_EVENTS_PER_S:,}/s",
                passed=ours >= TARGET_EVENTS_PER_S,
            )
        )
    ours_bytes, raw_bytes = bytes_per_block()
    out.append(
        Row(
            "kv_events: bytes per tracked block (1M blocks)",
            ours_bytes,
            "bytes",
            baseline=raw_bytes,
            baseline_name="the decoded batches kept",
            target=f"<= {TARGET_BYTES_PER_BLOCK}",
            passed=ours_bytes <= TARGET_BYTES_PER_BLOCK,
        )
    )
    return out


if __name__ == "__main__":
    print_rows(rows())
