"""A hostile vLLM API server polled by a kvcap daemon process: bounded RSS, scrapes still served."""

from __future__ import annotations

import time

import pytest

from tests.collectors.test_vllm_http_hostile import engines_exposition, metrics_only, stand_in
from tests.faults.hostile import MAX_RSS_MIB, SCRAPE_WITHIN_S, daemon, scrape


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (engines_exposition(100_000), "too_many_samples"),  # 7.5 MB, under the 8 MiB limit
        (engines_exposition(2_000, model_name="m" * 4000), "too_many_engines"),  # 8.1 MB
        (engines_exposition(200, model_name="m" * 4000), "bad_label"),
    ],
    ids=["100k-engines", "2000-engines-4000-char-labels", "4000-char-labels"],
)
def test_a_hostile_vllm_costs_bounded_memory(body: bytes, reason: str) -> None:
    with (
        stand_in(metrics_only(body)) as (url, _),
        daemon(
            "--collector.vllm_http",
            f"--vllm.url={url}",
            "--vllm.poll-interval=0.5",
            "--vllm.timeout=5",
        ) as target,
    ):
        time.sleep(3.0)  # several polls of the hostile body
        reply = scrape(target)
        peak = target.peak_rss_mib()
        errors = target.counter(
            "kvcap_collector_errors_total", collector="vllm_http", reason=reason
        )
    print(
        f"hostile vLLM ({reason}): peak RSS {peak:.1f} MiB, scrape {reply.elapsed_s:.3f} s, "
        f"{errors:.0f} polls refused"
    )
    assert reply.status == 200
    assert reply.elapsed_s < SCRAPE_WITHIN_S
    assert peak < MAX_RSS_MIB
    assert errors >= 2
    assert b"kvcap_kv_cache_capacity_tokens{" not in reply.body
