"""How expensive is one capacity derivation? Ratios against parsing the same config.json.

The daemon re-derives capacity whenever an engine (re)starts or a source reports new
settings, and it must read config.json anyway, so json parsing is the natural baseline.
Run: .venv/bin/python benchmarks/bench_capacity.py
"""

from __future__ import annotations

import json
import statistics
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from exporter.capacity import EngineSettings, derive_capacity
from exporter.capacity.batch import settings_from_record

GOLDEN = Path(__file__).resolve().parent.parent / "tests/fixtures/golden/vllm-0.33-capacity.jsonl"


def best_of(repeats: int, func: Callable[[], object], number: int) -> float:
    """Seconds per call: the median of `repeats` timings of `number` calls each."""
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(number):
            func()
        timings.append((time.perf_counter() - start) / number)
    return statistics.median(timings)


def main() -> None:
    cases = {}
    for line in GOLDEN.read_text().splitlines():
        record = json.loads(line)
        if "result" in record:
            cases.setdefault(record["model"], record)
    print(f"{'model':22s} {'derive us':>10s} {'json us':>9s} {'ratio':>7s} {'peak KiB':>9s}")
    ratios = []
    for model, record in sorted(cases.items()):
        text = json.dumps(record["hf_config"])
        settings: EngineSettings = settings_from_record(record["settings"])
        memory = record["settings"]["available_kv_bytes_per_worker"]
        config = json.loads(text)

        def derive(
            config: dict[str, object] = config,
            settings: EngineSettings = settings,
            memory: int = memory,
        ) -> object:
            return derive_capacity(config, settings, available_kv_bytes_per_worker=memory)

        def parse(text: str = text) -> object:
            return json.loads(text)

        derive_s = best_of(5, derive, 50)
        parse_s = best_of(5, parse, 500)
        tracemalloc.start()
        derive()
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        ratios.append(derive_s / parse_s)
        print(
            f"{model:22s} {derive_s * 1e6:10.1f} {parse_s * 1e6:9.1f} "
            f"{derive_s / parse_s:7.1f} {peak / 1024:9.1f}"
        )
    print(f"median ratio derive/json-parse: {statistics.median(ratios):.1f}x")


if __name__ == "__main__":
    main()
