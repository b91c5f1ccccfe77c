"""Parsing a 64-engine vLLM /metrics body: kvcap's scanner against prometheus_client's parser.

The body is vLLM 0.33's own exposition (qwen3-next, DP 2, with every histogram) widened
to 64 engines by repeating each engine's series with new `engine` labels: several MB,
mostly histogram buckets, as a large data-parallel deployment serves it.
Run: .venv/bin/python -m benchmarks.parse
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.common import Row, print_rows
from exporter.collectors.parsing import parse_cache_config_info, parse_vllm_metrics

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests/fixtures/golden/expositions/qwen3-next-80b-a3b-dp2-tp2.vllm-0.33.txt"
ENGINES = 64
_ENGINE = re.compile(r'engine="0"')


def wide_exposition(engines: int) -> str:
    """Every engine-0 series copied for engines 0..engines-1 (engine-1 series dropped)."""
    lines = []
    for line in FIXTURE.read_text().splitlines():
        if 'engine="1"' in line:
            continue
        if 'engine="0"' in line:
            lines.extend(_ENGINE.sub(f'engine="{i}"', line) for i in range(engines))
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def median_s(func: Callable[[], object], repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def ours(body: str) -> int:
    samples = parse_vllm_metrics(body)
    return len(parse_cache_config_info(samples["vllm:cache_config_info"]))


def theirs(body: str) -> int:
    return sum(len(f.samples) for f in text_string_to_metric_families(body))


def rows() -> list[Row]:
    body = wide_exposition(ENGINES)
    assert ours(body) == ENGINES
    kvcap_s = median_s(lambda: ours(body), 21)
    client_s = median_s(lambda: theirs(body), 5)
    figure = f"parse {ENGINES}-engine /metrics ({len(body) / 2**20:.1f} MiB)"
    return [
        Row(
            figure,
            kvcap_s * 1e3,
            "ms",
            client_s * 1e3,
            "prometheus_client parser",
            ">= 50x faster",
            client_s / kvcap_s >= 50,
        )
    ]


def main() -> None:
    print_rows(rows())


if __name__ == "__main__":
    main()
