"""The offload tier's settings from vLLM's own flags: `--kv-offloading-size`,
`--kv-offloading-backend` and `--kv-transfer-config`, checked as vLLM checks them.

vLLM's `VllmConfig._post_init_kv_transfer_config` turns `--kv-offloading-size GiB` with the
native backend into the OffloadingConnector with `cpu_bytes_to_use = size x 2**30` (one
engine, all its workers), merged into any `kv_connector_extra_config` given; the lmcache
backend starts LMCache's connector, whose tier LMCache sizes itself (its `LMCACHE_*`
settings), so vLLM's size is not passed on. A `--kv-transfer-config` naming the
OffloadingConnector sizes the tier by `cpu_bytes_to_use` (bytes) in its extra config.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from exporter.capacity.offload import GIB, OffloadSettings
from exporter.errors import UsageError

# The native connector's names (0.27 and later; SimpleCPUOffloadConnector with
# VLLM_USE_SIMPLE_KV_OFFLOAD=1 is another design kvcap does not model).
NATIVE_CONNECTORS: Final = frozenset({"OffloadingConnector"})
LMCACHE_CONNECTORS: Final = frozenset({"LMCacheConnectorV1", "LMCacheMPConnector"})
BACKENDS: Final = ("native", "lmcache")
# A --kv-transfer-config is a small JSON object; anything this long is hostile.
MAX_TRANSFER_CONFIG_CHARS: Final = 16_384
# Tiers beyond 1 PiB are not a host's memory: refused before any arithmetic.
MAX_OFFLOAD_GIB: Final = float(1 << 20)


def parse_transfer_config(text: str) -> dict[str, Any]:
    """`--kv-transfer-config` as vLLM reads it: one JSON object."""
    if len(text) > MAX_TRANSFER_CONFIG_CHARS:
        raise UsageError(
            f"--kv-transfer-config: {len(text)} characters, more than {MAX_TRANSFER_CONFIG_CHARS}"
        )
    try:
        value = json.loads(text)
    except ValueError as error:
        raise UsageError(f"--kv-transfer-config: not JSON ({error})") from None
    if not isinstance(value, dict):
        raise UsageError("--kv-transfer-config: must be a JSON object")
    return value


def offload_size_bytes(
    size_gib: float, host_memory_bytes: int | None = None, flag: str = "--kv-offloading-size"
) -> int:
    """The tier's size in bytes, refused where vLLM's tier could not exist; `flag` is the
    one the size came from, named in the refusal."""
    if not math.isfinite(size_gib) or size_gib <= 0:
        raise UsageError(f"{flag}: the tier must be a positive size, got {size_gib:g} GiB")
    if size_gib > MAX_OFFLOAD_GIB:
        raise UsageError(f"{flag}: {size_gib:g} GiB is more than {MAX_OFFLOAD_GIB:g}")
    size = int(size_gib * GIB)
    if host_memory_bytes is not None and size > host_memory_bytes:
        raise UsageError(
            f"{flag}: {size_gib:g} GiB is more than the host's memory "
            f"({host_memory_bytes / GIB:.1f} GiB, --host-memory)"
        )
    return size


def offload_settings(
    *,
    size_gib: float | None,
    backend: str | None,
    transfer_config: Mapping[str, Any] | None,
    host_memory_bytes: int | None = None,
) -> OffloadSettings | None:
    """The native tier the flags give the engine; None when they give none. An LMCache
    tier is `backend="lmcache"` with no bytes of vLLM's (LMCache sizes it)."""
    chosen = backend or "native"
    if chosen not in BACKENDS:
        raise UsageError(
            f"--kv-offloading-backend: unknown backend {chosen[:40]!r} "
            f"(choose from {', '.join(BACKENDS)})"
        )
    extra = _extra_config(transfer_config)
    connector = _connector(transfer_config)
    if size_gib is not None:
        size = offload_size_bytes(size_gib, host_memory_bytes)
        if chosen == "lmcache":
            return None
        return native_settings(size, transfer_config)
    if connector is None:
        return None
    if connector in LMCACHE_CONNECTORS:
        return None
    if connector not in NATIVE_CONNECTORS:
        raise UsageError(
            f"--kv-transfer-config: unknown kv_connector {connector[:40]!r} "
            f"(kvcap models {', '.join(sorted(NATIVE_CONNECTORS | LMCACHE_CONNECTORS))})"
        )
    raw = extra.get("cpu_bytes_to_use")
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not _finite(raw):
        raise UsageError(
            "--kv-transfer-config: the OffloadingConnector needs a number "
            "kv_connector_extra_config.cpu_bytes_to_use"
        )
    size = offload_size_bytes(raw / GIB, host_memory_bytes, "--kv-transfer-config cpu_bytes_to_use")
    return native_settings(size, transfer_config)


def uses_lmcache(*, backend: str | None, transfer_config: Mapping[str, Any] | None) -> bool:
    """Whether the engine's offload tier is LMCache's."""
    return backend == "lmcache" or _connector(transfer_config) in LMCACHE_CONNECTORS


def _connector(transfer_config: Mapping[str, Any] | None) -> str | None:
    if transfer_config is None:
        return None
    connector = transfer_config.get("kv_connector")
    if connector is None:
        return None
    if not isinstance(connector, str):
        raise UsageError("--kv-transfer-config: kv_connector must be a string")
    return connector


def _extra_config(transfer_config: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if transfer_config is None:
        return {}
    extra = transfer_config.get("kv_connector_extra_config", {})
    if not isinstance(extra, Mapping):
        raise UsageError("--kv-transfer-config: kv_connector_extra_config must be an object")
    return extra


def native_settings(cpu_bytes: int, transfer_config: Mapping[str, Any] | None) -> OffloadSettings:
    """The native tier of `cpu_bytes` with the chunk size of the transfer config's
    `kv_connector_extra_config` (`blocks_per_chunk` or `block_size`, checked)."""
    extra = _extra_config(transfer_config)
    chunk = {key: _positive(extra, key) for key in ("blocks_per_chunk", "block_size")}
    if chunk["blocks_per_chunk"] is not None and chunk["block_size"] is not None:
        raise UsageError(
            "--kv-transfer-config: give only one of block_size or blocks_per_chunk "
            "in kv_connector_extra_config"
        )
    return OffloadSettings(
        cpu_bytes=cpu_bytes,
        blocks_per_chunk=chunk["blocks_per_chunk"],
        tokens_per_chunk=chunk["block_size"],
    )


def _positive(extra: Mapping[str, Any], key: str) -> int | None:
    value = extra.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 1 << 20:
        raise UsageError(
            f"--kv-transfer-config: kv_connector_extra_config.{key} must be a whole "
            f"number from 1 to {1 << 20}, got {str(value)[:40]}"
        )
    return value


def _finite(number: float) -> bool:
    """math.isfinite, and False for an integer past any float (JSON allows hundreds of
    digits; isfinite raises OverflowError on them)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False
