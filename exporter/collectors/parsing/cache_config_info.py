"""Typed records of vLLM's `vllm:cache_config_info` series, one per `engine` label.

vLLM writes `str()` of every `CacheConfig` field as a label, so the label set changes
between releases: labels are read by key, unknown ones are ignored, and a missing label
or the text "None" gives None. Per-engine vs sum is left to the caller: `num_gpu_blocks`
is the sum over the engines one API server manages, while `kv_cache_size_tokens` and
`kv_cache_max_concurrency` are one engine's values (see the vLLM interfaces reference).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, get_type_hints

from exporter.collectors.parsing.exposition import MalformedExposition, Sample

FAMILY = "vllm:cache_config_info"


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheConfigInfo:
    """The `cache_config_info` labels of one engine; None where absent or "None"."""

    engine: str  # the global DP rank as vLLM writes it; "" on a series without the label
    labels: Mapping[str, str]  # every label, as written
    num_gpu_blocks: int | None
    block_size: int | None
    kv_cache_size_tokens: int | None
    kv_cache_max_concurrency: float | None
    gpu_memory_utilization: float | None
    cache_dtype: str | None
    enable_prefix_caching: bool | None
    num_gpu_blocks_override: int | None
    sliding_window: int | None
    mamba_block_size: int | None
    effective_attention_block_size: int | None
    kv_cache_memory_bytes: int | None
    user_specified_block_size: bool | None


def parse_cache_config_info(samples: Iterable[Sample]) -> list[CacheConfigInfo]:
    """One record per distinct `engine` label value, in order of first appearance.

    A repeated engine keeps its last series (vLLM writes identical ones). Raises
    MalformedExposition naming the label when a value is not what vLLM writes there.
    """
    by_engine: dict[str, CacheConfigInfo] = {}
    for sample in samples:
        engine = sample.labels.get("engine", "")
        by_engine[engine] = _record(engine, InfoLabels(engine, sample.labels))
    return list(by_engine.values())


def _record(engine: str, labels: InfoLabels) -> CacheConfigInfo:
    read = {name: reader(labels, name) for name, reader in _LABEL_READERS}
    return CacheConfigInfo(engine=engine, labels=dict(labels.raw), **read)


@dataclass(frozen=True, slots=True)
class InfoLabels:
    """Typed reads of one info series' labels; errors name the family, engine and label."""

    engine: str
    raw: Mapping[str, str]
    family: str = FAMILY

    def text(self, key: str) -> str | None:
        value = self.raw.get(key)
        # `str(None)` is how vLLM writes an unset field; an empty value is as good as absent.
        return None if value in (None, "", "None") else value

    def integer(self, key: str) -> int | None:
        """Every integer field of CacheConfig is a count or a size: never negative."""
        value = self.text(key)
        if value is None:
            return None
        if value.isdigit() and value.isascii() and len(value) <= 20:
            number = int(value)  # exact, where a float would round above 2**53
        else:
            # Tolerate `16.0`, should a release ever write an int field through a float.
            real = self._number(key, value, "a whole number")
            if not real.is_integer():
                raise self.error(key, value, "a whole number")
            number = int(real)
        if number >= 2**63:  # vLLM's own integers are int64 at most
            raise self.error(key, value, "a whole number below 2**63")
        return number

    def real(self, key: str) -> float | None:
        """A ratio or a fraction (concurrency, memory utilisation): never negative."""
        value = self.text(key)
        return None if value is None else self._number(key, value, "a number")

    def boolean(self, key: str) -> bool | None:
        value = self.text(key)
        if value is None:
            return None
        if value not in ("True", "False"):
            raise self.error(key, value, '"True" or "False"')
        return value == "True"

    def _number(self, key: str, value: str, expected: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise self.error(key, value, expected) from None
        # NaN, infinities and negative values are not what vLLM writes: no figure from them.
        if not math.isfinite(number) or number < 0:
            raise self.error(key, value, f"{expected} >= 0")
        return number

    def error(self, key: str, value: str, expected: str) -> MalformedExposition:
        return MalformedExposition(
            f"{self.family} engine {self.engine!r}: label {key}={value!r} is not {expected}"
        )


# Each label field of the record is read by its name, as its declared type says: a label
# added to CacheConfigInfo is read without a second list to keep in step.
_READER_OF_TYPE: dict[object, Callable[[InfoLabels, str], Any]] = {
    int | None: InfoLabels.integer,
    float | None: InfoLabels.real,
    str | None: InfoLabels.text,
    bool | None: InfoLabels.boolean,
}
_LABEL_READERS = tuple(
    (name, _READER_OF_TYPE[kind])
    for name, kind in get_type_hints(CacheConfigInfo).items()
    if name not in ("engine", "labels")
)
