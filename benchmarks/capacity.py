"""How expensive is one capacity derivation, and one `kvcap-exporter capacity` command?

The daemon re-derives capacity whenever an engine (re)starts or a source reports new
settings, and it must read config.json anyway, so json parsing is the baseline of one
derivation. The command is timed as a whole process (start-up and imports included, as an
operator waits for it) against `python -c pass` started the same way, in turn, in the
same run. Run: .venv/bin/python -m benchmarks.capacity
"""

from __future__ import annotations

import compileall
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import Row, print_rows
from exporter.capacity import EngineSettings, derive_capacity, settings_from_record

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests/fixtures/golden/vllm-0.33-capacity.jsonl"
LLAMA = ROOT / "tests/fixtures/golden/handshake/configs/llama-3.1-8b"
COMMAND_TARGET_S = 0.15  # an answer at the speed of a shell command
SWEEP_TARGET_S = 1.0
# `python -c pass` on a quiet machine (0.38 s was 16x it). A target is judged as this
# multiple of the `python -c pass` of the same run, so that a loaded machine, which slows
# both alike, does not fail it: 0.15 s is 6.25x, 1 s is 42x.
QUIET_PYTHON_S = 0.024
# 25 context lengths x 4 tensor-parallel sizes: a 100-row sweep.
SWEEP = [
    "--sweep",
    "max-model-len=" + ",".join(f"{k}k" for k in range(4, 104, 4)),
    "--sweep",
    "tp=1,2,4,8",
]


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
    return derivation_rows() + command_rows()


def derivation_rows() -> list[Row]:
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


def command_rows(runs: int = 15) -> list[Row]:
    """`capacity` once and as a 100-row sweep, each run paired with a `python -c pass`.

    The package's bytecode is compiled first, as pip does when it installs the wheel: a
    source tree run under PYTHONDONTWRITEBYTECODE would otherwise compile every module
    on every run and time the compiler."""
    compileall.compile_dir(ROOT / "exporter", quiet=1)
    script = Path(sys.executable).with_name("kvcap-exporter")
    kvcap = [str(script)] if script.exists() else [sys.executable, "-m", "exporter.cli"]
    plan = [*kvcap, "capacity", str(LLAMA), "--kv-cache-memory-bytes", "20GiB"]
    baseline = [sys.executable, "-c", "pass"]
    rows = []
    for figure, command, target in (
        ("capacity command, whole process, median", plan, COMMAND_TARGET_S),
        ("capacity --sweep of 100 rows, whole process, median", [*plan, *SWEEP], SWEEP_TARGET_S),
    ):
        ours, theirs = _paired_runs(command, baseline, runs)
        times = target / QUIET_PYTHON_S
        rows.append(
            Row(
                figure,
                ours,
                "s",
                theirs,
                "python -c pass, same runs",
                f"< {target} s: < {times:.3g}x baseline",
                ours < times * theirs,
            )
        )
    return rows


def _paired_runs(command: list[str], baseline: list[str], runs: int) -> tuple[float, float]:
    """Median wall seconds of each, started in turn (A B A B ...) after one warm-up each,
    so that a machine that speeds up or slows down moves both alike."""
    ours, theirs = [], []
    for index in range(runs + 1):
        for argv, times in ((command, ours), (baseline, theirs)):
            start = time.perf_counter()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
            if index:
                times.append(time.perf_counter() - start)
    return statistics.median(ours), statistics.median(theirs)


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
