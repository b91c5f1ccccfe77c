"""Pure parsers of what vLLM shows the outside: its `/metrics` text and its command line.

No I/O happens here; collectors fetch the text and pass a string.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from exporter.lazy_names import lazy_getattr

if TYPE_CHECKING:
    from exporter.collectors.parsing.cache_config_info import (
        CacheConfigInfo,
        parse_cache_config_info,
    )
    from exporter.collectors.parsing.exposition import (
        MAX_LABEL_VALUE_CHARS,
        MAX_LABELS_PER_SAMPLE,
        VLLM_FAMILIES,
        MalformedExposition,
        Sample,
        parse_vllm_metrics,
    )
    from exporter.collectors.parsing.offload_info import (
        offload_from_cache_config,
        parse_offload_info,
    )
    from exporter.collectors.parsing.vllm_args import (
        VllmServeArgs,
        parse_vllm_serve_args,
        to_engine_settings,
        vllm_flag_value,
        without_launcher,
    )

# Each name is imported on first use: the offload parser needs the state package (and
# structlog), which a reader of a `vllm serve` command line does not.
_NAMES: dict[str, tuple[str, ...]] = {
    "exporter.collectors.parsing.cache_config_info": ("CacheConfigInfo", "parse_cache_config_info"),
    "exporter.collectors.parsing.exposition": (
        "MAX_LABEL_VALUE_CHARS",
        "MAX_LABELS_PER_SAMPLE",
        "VLLM_FAMILIES",
        "MalformedExposition",
        "Sample",
        "parse_vllm_metrics",
    ),
    "exporter.collectors.parsing.offload_info": ("offload_from_cache_config", "parse_offload_info"),
    "exporter.collectors.parsing.vllm_args": (
        "VllmServeArgs",
        "parse_vllm_serve_args",
        "to_engine_settings",
        "vllm_flag_value",
        "without_launcher",
    ),
}
__getattr__ = lazy_getattr(__name__, _NAMES)

__all__ = [
    "MAX_LABELS_PER_SAMPLE",
    "MAX_LABEL_VALUE_CHARS",
    "VLLM_FAMILIES",
    "CacheConfigInfo",
    "MalformedExposition",
    "Sample",
    "VllmServeArgs",
    "offload_from_cache_config",
    "parse_cache_config_info",
    "parse_offload_info",
    "parse_vllm_metrics",
    "parse_vllm_serve_args",
    "to_engine_settings",
    "vllm_flag_value",
    "without_launcher",
]
