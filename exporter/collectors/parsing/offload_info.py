"""The capacity of each engine's KV offload tiers, from vLLM's info series.

Two shapes:
- `vllm:kv_offload_config_info` (vLLM PR #53902, on the generic info metric of #56867): one
  series per engine, labels `<medium>_num_chunks`, `<medium>_blocks_per_chunk`,
  `<medium>_kv_bytes_per_chunk` and `<medium>_capacity_tokens_at_max_len` (medium "cpu"),
  the text "None" for an unknown fact. Blocks = chunks x blocks per chunk (GPU blocks),
  bytes = chunks x page-aligned chunk bytes, tokens = vLLM's own bound.
- Released vLLM (0.11 and later): only `vllm:cache_config_info`'s `kv_offloading_size` (GiB,
  all TP ranks of the engine) with `kv_offloading_backend="native"`: vLLM gives the CPU
  tier int(size x 2**30) bytes to cut into chunks, the tier's size in bytes at most.
  LMCache's tier is sized by LMCache (0.27 and later do not pass the size on): not read.
A label that is there but not what vLLM writes raises MalformedExposition.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

from exporter.capacity.offload import GIB
from exporter.collectors.parsing.cache_config_info import CacheConfigInfo, InfoLabels
from exporter.collectors.parsing.exposition import MalformedExposition, Sample
from exporter.state import OffloadTier

FAMILY: Final = "vllm:kv_offload_config_info"
# Tiers one engine may show: CPU, and a few more a tiering spec could add; past that, hostile.
MAX_MEDIUMS: Final = 8
_MEDIUM = re.compile(r"([a-z][a-z0-9]{0,15})_num_chunks")
_LIMIT: Final = 2**63  # vLLM's integers are int64 at most, and so must their products be


def parse_offload_info(samples: Iterable[Sample]) -> dict[str, tuple[OffloadTier, ...]]:
    """Each engine's tiers from `vllm:kv_offload_config_info`, by `engine` label ("" for a
    series without one). Two series of one engine that disagree are refused."""
    seen: dict[str, Mapping[str, str]] = {}
    tiers: dict[str, tuple[OffloadTier, ...]] = {}
    for sample in samples:
        engine = sample.labels.get("engine", "")
        if engine in seen and seen[engine] != sample.labels:
            raise MalformedExposition(
                f"{FAMILY}: two series of engine {engine[:40]!r} with different labels"
            )
        seen[engine] = sample.labels
        tiers[engine] = _tiers(InfoLabels(engine, sample.labels, FAMILY))
    return tiers


def _tiers(labels: InfoLabels) -> tuple[OffloadTier, ...]:
    mediums = sorted(m.group(1) for key in labels.raw if (m := _MEDIUM.fullmatch(key)))
    if len(mediums) > MAX_MEDIUMS:
        raise MalformedExposition(
            f"{FAMILY} engine {labels.engine[:40]!r}: {len(mediums)} offload tiers, "
            f"more than {MAX_MEDIUMS}",
            reason="bad_label",
        )
    return tuple(_tier(labels, medium) for medium in mediums)


def _tier(labels: InfoLabels, medium: str) -> OffloadTier:
    chunks = labels.integer(f"{medium}_num_chunks")
    per_chunk = labels.integer(f"{medium}_blocks_per_chunk")
    chunk_bytes = labels.integer(f"{medium}_kv_bytes_per_chunk")
    tokens = labels.integer(f"{medium}_capacity_tokens_at_max_len")
    return OffloadTier(
        medium=medium,
        capacity_tokens=tokens,
        capacity_blocks=_product(labels, chunks, per_chunk, f"{medium}_blocks_per_chunk"),
        capacity_bytes=_product(labels, chunks, chunk_bytes, f"{medium}_kv_bytes_per_chunk"),
    )


def _product(labels: InfoLabels, chunks: int | None, each: int | None, key: str) -> int | None:
    if chunks is None or each is None:
        return None
    if chunks * each >= _LIMIT:
        raise labels.error(
            key, labels.raw[key], f"a size whose tier stays below 2**63 ({chunks} chunks)"
        )
    return chunks * each


def offload_from_cache_config(info: CacheConfigInfo) -> tuple[OffloadTier, ...]:
    """The CPU tier released vLLM configures (`--kv-offloading-size`), in bytes."""
    labels = InfoLabels(info.engine, info.labels)
    size = labels.real("kv_offloading_size")
    if size is None or labels.text("kv_offloading_backend") != "native":
        return ()
    budget = int(size * GIB)
    if budget >= _LIMIT:
        raise labels.error(
            "kv_offloading_size", labels.raw["kv_offloading_size"], "a size below 2**63 bytes"
        )
    return (OffloadTier("cpu", capacity_bytes=budget, source="cache_config_info"),)
