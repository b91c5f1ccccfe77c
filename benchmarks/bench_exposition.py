"""How fast is the targeted /metrics scanner? Against prometheus_client's full text parser.

kvcap scrapes vLLM every 5 s; bodies are 50-85 KB per API server and grow with histograms.
Run: .venv/bin/python benchmarks/bench_exposition.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.sources.parsing import parse_cache_config_info, parse_vllm_metrics

EXPOSITIONS = Path(__file__).resolve().parent.parent / "tests/fixtures/golden/expositions"


def median_of(repeats: int, func: Callable[[], object], number: int) -> float:
    """Seconds per call: the median of `repeats` timings of `number` calls each."""
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            func()
        timings.append((time.perf_counter() - start) / number)
    return statistics.median(timings)


def main() -> None:
    paths = sorted(EXPOSITIONS.glob("*.txt")) + sorted(EXPOSITIONS.glob("releases/*/*.txt"))
    largest = max(paths, key=lambda path: path.stat().st_size)
    bodies = {"largest: " + str(largest.relative_to(EXPOSITIONS)): largest.read_text()}
    body = bodies[next(iter(bodies))]
    bodies["largest x4 (340 KB, DP=8-like)"] = body * 4
    print(f"{'body':58s} {'KB':>5s} {'ours us':>8s} {'+info us':>8s} {'p_c us':>8s} {'ratio':>6s}")
    for name, text in bodies.items():
        ours = median_of(7, lambda text=text: parse_vllm_metrics(text), 50)
        full = median_of(
            7,
            lambda text=text: parse_cache_config_info(
                parse_vllm_metrics(text)["vllm:cache_config_info"]
            ),
            50,
        )
        theirs = median_of(5, lambda text=text: list(text_string_to_metric_families(text)), 3)
        print(
            f"{name:58s} {len(text) / 1000:5.0f} {ours * 1e6:8.0f} {full * 1e6:8.0f}"
            f" {theirs * 1e6:8.0f} {theirs / ours:6.0f}x"
        )
    total_ours = sum(median_of(3, lambda p=p: parse_vllm_metrics(p.read_text()), 10) for p in paths)
    print(f"all {len(paths)} fixtures: ours {total_ours * 1e3:.1f} ms in total")


if __name__ == "__main__":
    main()
