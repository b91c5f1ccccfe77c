"""Shared pieces of the benchmarks: a result row, timing helpers and the table printer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Row:
    """One measured figure, with the baseline measured in the same run."""

    figure: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str = ""
    target: str = ""
    passed: bool | None = None  # None: reported, no target

    @property
    def ratio(self) -> float | None:
        if self.baseline is None or self.value == 0:
            return None
        return self.baseline / self.value

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99) - 1)]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def timed(func: Callable[[], object], repeats: int) -> list[float]:
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        timings.append(time.perf_counter() - start)
    return timings


def print_rows(rows: Sequence[Row]) -> None:
    header = f"{'figure':52s} {'value':>12s} {'baseline':>12s} {'ratio':>8s}  {'target':24s} result"
    print(header)
    print("-" * len(header))
    for row in rows:
        baseline = f"{row.baseline:.4g}" if row.baseline is not None else "-"
        ratio = f"{row.ratio:.1f}x" if row.ratio is not None else "-"
        result = {True: "pass", False: "FAIL", None: "report"}[row.passed]
        print(
            f"{row.figure:52s} {row.value:>9.4g} {row.unit:2s} {baseline:>12s} {ratio:>8s}  "
            f"{row.target:24s} {result}"
        )
