"""What a collector was told about an engine (`--vllm.args`) against what the engine shows.

Pure: a derivation from the wrong settings must never be silent, so each contradiction
becomes a SettingsMismatch the state logs once, /engines lists and a gauge counts.

    server_mismatches(args, served_name="google/gemma-3-27b-it", max_model_len=131072,
                      engines=2)
"""

from __future__ import annotations

from exporter.collectors.parsing import CacheConfigInfo, VllmServeArgs
from exporter.state import SettingsMismatch

MODELS = "/v1/models"
METRICS = "/metrics"


def server_mismatches(
    args: VllmServeArgs | None,
    *,
    served_name: str | None,
    max_model_len: int | None,
    engines: int,
) -> tuple[SettingsMismatch, ...]:
    """The settings one API server shows for all its engines: the served name and
    max_model_len (/v1/models), the number of engines behind it (/metrics)."""
    if args is None:
        return ()
    found = []
    if args.model_name and served_name and args.model_name != served_name:
        found.append(SettingsMismatch("served_model_name", args.model_name, served_name, MODELS))
    told_length = args.max_model_len
    if told_length not in (None, -1) and max_model_len and told_length != max_model_len:
        found.append(
            SettingsMismatch("max_model_len", str(told_length), str(max_model_len), MODELS)
        )
    expected = expected_engines(args)
    if engines and expected is not None and engines != expected:
        found.append(
            SettingsMismatch("data_parallel_size", str(expected), f"{engines} engines", METRICS)
        )
    return tuple(found)


def expected_engines(args: VllmServeArgs) -> int | None:
    """Engines behind this API server by its flags: one with an external load balancer
    (`--data-parallel-rank`), the node's local engines, else every DP rank."""
    if args.data_parallel_rank is not None:
        return 1
    if args.data_parallel_size_local is not None:
        return args.data_parallel_size_local or None  # 0: a headless node, no API server
    return args.data_parallel_size or 1


def engine_mismatches(
    args: VllmServeArgs | None,
    info: CacheConfigInfo | None,
    derived_block_size: int | None,
) -> tuple[SettingsMismatch, ...]:
    """One engine's cache_config_info against the told settings: a told `--block-size` (as
    the told settings plan it, since vLLM raises it for hybrid and MLA models) and a told
    `--kv-cache-dtype`."""
    if args is None or info is None:
        return ()
    found = []
    told_block = None if args.block_size is None else derived_block_size or args.block_size
    if told_block is not None and info.block_size is not None and told_block != info.block_size:
        found.append(SettingsMismatch("block_size", str(told_block), str(info.block_size), METRICS))
    told_dtype = args.kv_cache_dtype
    if told_dtype not in (None, "auto") and info.cache_dtype and told_dtype != info.cache_dtype:
        found.append(SettingsMismatch("kv_cache_dtype", told_dtype, info.cache_dtype, METRICS))
    return tuple(found)
