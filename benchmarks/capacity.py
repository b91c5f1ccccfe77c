"""How expensive is one capacity derivation? Ratios against parsing the same config.json.

The daemon re-derives capacity whenever an engine (re)starts or a source reports new
settings, and it must read config.json anyway, so json parsing is the natural baseline.
Run: .venv/bin/python -m benchmarks.capacity
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import Row, print_rows
from exporter.capacity import EngineSettings, derive_capacity, settings_from_record

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


def rows() -> list[Row]:
    ratios, derive_times = [], []
    for record in _first_case_per_model().values():
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
        derive_times.append(derive_s)
        ratios.append(derive_s / best_of(5, parse, 500))
    value = statistics.median(derive_times) * 1e6
    return [
        Row(
            "capacity derivation per engine (median of 13 families)",
            value,
            "us",
            value / statistics.median(ratios),
            "json.loads of the config.json",
            "report",
        )
    ]


def _first_case_per_model() -> dict[str, dict[str, object]]:
    cases: dict[str, dict[str, object]] = {}
    for line in GOLDEN.read_text().splitlines():
        record = json.loads(line)
        if "result" in record:
            cases.setdefault(record["model"], record)
    return cases


def main() -> None:
    print_rows(rows())


if __name__ == "__main__":
    main()
