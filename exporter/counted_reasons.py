"""Every `reason` label kvcap counts a refusal or failure under, per counter, in one place.

The collectors pass reasons to the state as plain strings (a reason is a label value, not
a type); this registry is what they may pass. `docs/reliability.md`'s budget table names a
reason for each bound, and `tests/test_budget_table.py` checks both that every reason the
table names is declared here and that every reason the code's source passes is (so
neither can drift).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from exporter.web import REJECT_REASONS, RELOAD_ERROR_REASONS

# kvcap_collector_errors_total{collector, reason}, per collector.
COLLECTOR_ERROR_REASONS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "vllm_http": frozenset(
            {
                # the fetch (collectors/http_fetch.py)
                "timeout",
                "connection_refused",
                "connection_reset",
                "dns",
                "network",
                "redirect",
                "truncated",
                "body_too_large",
                "content_type",
                "gzip_corrupt",
                "http_4xx",
                "http_5xx",
                # the documents (collectors/parsing/, vllm_http_reports.py)
                "malformed_exposition",
                "too_many_samples",
                "too_many_engines",
                "bad_label",
                "internal_error",
                # files named by a vLLM command line (bounded_files.py, model_config.py)
                "file_not_regular",
                "file_too_large",
                "file_read_timeout",
                "file_malformed",
            }
        ),
        "handshake": frozenset(
            {
                "frame_too_large",
                "unknown_topic",
                "wrong_frame_count",
                "malformed_frame",
                "rate_limited",
                "engine_rate_limited",
                "too_many_engines",
                "too_many_groups",
                "too_many_workers",
                "too_many_devices",
                "series_budget",
                "instance_conflict",
                "token_mismatch",
                "bye_refused",
                "internal_error",
                # the plugin's offload settings (collectors/handshake_offload.py)
                "bad_offload_settings",
            }
        ),
        "kv_events": frozenset(
            {
                "malformed_batch",
                "not_connected",
                "disconnected",
                "internal_error",
                # the stream (kv_events_subscription.py)
                "resubscribed",
                "rate_limited",
                "subscribe_failed",
                "too_many_subscriptions",
                # replays (kv_events_replay.py)
                "too_many_replays",
                "replay_timeout",
                "replay_cut_short",
                "replay_failed",
                # the residency's bounds (prefix_cache/residency.py)
                "pool_overflow",
                "too_many_groups",
                "too_many_media",
            }
        ),
        "nvml": frozenset({"gpu_lost", "nvml_error", "internal"}),
    }
)
# kvcap_kv_events_dropped_total{engine, reason}: events or blocks not applied.
KV_EVENTS_DROPPED_REASONS: Final = frozenset(
    {"rejected", "malformed_batch", "missed", "unknown_block", "too_many_media"}
)

# Each counter with a reason label, and the reasons it may carry.
COUNTED_REASONS: Final[Mapping[str, frozenset[str]]] = MappingProxyType(
    {
        "kvcap_collector_errors_total": frozenset().union(*COLLECTOR_ERROR_REASONS.values()),
        "kvcap_kv_events_dropped_total": KV_EVENTS_DROPPED_REASONS,
        "kvcap_web_requests_rejected_total": frozenset(REJECT_REASONS),
        "kvcap_web_config_reload_errors_total": frozenset(RELOAD_ERROR_REASONS),
    }
)
