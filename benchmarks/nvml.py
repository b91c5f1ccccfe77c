"""NVML: the cost of one collection of 8 GPUs through nvidia-ml-py and the test library.

Measured, as median and p99 over many rounds:
- read: `NvmlSession.read()`, everything the source reads per poll (memory v2, processes,
  MIG mode) for 8 H200s with one process each; identity is read once per session.
- poll: `NvmlPoller.poll_once()`, the read plus publishing into a StateStore.
- baseline, in the same run: the bare binding call for memory only,
  `nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)` on 8 handles fetched
  beforehand, the least any collector of GPU memory does.
The test library (tools/nvml/fake_nvml.c) reads its config file on every call, so its
per-call cost is a small file read: the ratio to the baseline and the calls per read carry
over to a real driver, the microseconds do not (scripts/nvml-check.py times a real one).
Run: .venv/bin/python -m benchmarks.nvml
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pynvml  # type: ignore[import-untyped]

from benchmarks.common import Row, median, p99, print_rows, timed
from exporter.collectors import NvmlPoller, NvmlSession, NvmlSettings, load_library
from exporter.logs import configure_logging
from exporter.state import StateStore
from tools.nvml.build import build_fake_nvml
from tools.nvml.fake import FakeNvml, eight_h200s

ROUNDS = 2000
GPUS = 8


def warm_timed(action: Callable[[], object]) -> list[float]:
    timed(action, ROUNDS // 10)
    return timed(action, ROUNDS)


@dataclass(frozen=True, slots=True)
class Measured:
    read: list[float]
    poll: list[float]
    baseline: list[float]
    calls: int  # NVML calls of a read
    first_calls: int  # of a session's first read, which also reads identity


def measure(fake: FakeNvml) -> Measured:
    session = NvmlSession(None)
    before = fake.call_count()
    session.read()  # the first read of a session also reads identity
    first_calls = fake.call_count() - before
    before = fake.call_count()
    session.read()
    calls = fake.call_count() - before
    read = warm_timed(session.read)
    session.close()

    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(GPUS)]

    def memory_only() -> None:
        for handle in handles:
            pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)

    baseline = warm_timed(memory_only)
    pynvml.nvmlShutdown()

    poller = NvmlPoller(NvmlSettings(), StateStore(), threading.Event())
    poll = warm_timed(poller.poll_once)
    poller.close()
    return Measured(read, poll, baseline, calls, first_calls)


def rows() -> list[Row]:
    configure_logging("warn")
    with tempfile.TemporaryDirectory() as tmp:
        fake = FakeNvml(build_fake_nvml(Path(tmp)), Path(tmp) / "nvml.conf")
        fake.write(eight_h200s())
        previous = os.environ.get("FAKE_NVML_CONFIG")
        os.environ["FAKE_NVML_CONFIG"] = str(fake.config_path)
        load_library(str(fake.library))
        try:
            figures = measure(fake)
        finally:
            if previous is None:
                del os.environ["FAKE_NVML_CONFIG"]
            else:
                os.environ["FAKE_NVML_CONFIG"] = previous
    read, poll, baseline, calls = figures.read, figures.poll, figures.baseline, figures.calls
    base = f"bare GetMemoryInfo(v2) x{GPUS}"
    per_call = median(baseline) / GPUS
    return [
        Row(
            f"nvml read, {GPUS} GPUs: median",
            median(read) * 1e6,
            "us",
            median(baseline) * 1e6,
            base,
            "report",
        ),
        Row(
            f"nvml read, {GPUS} GPUs: p99",
            p99(read) * 1e6,
            "us",
            p99(baseline) * 1e6,
            base,
            "report",
        ),
        Row(
            f"nvml poll (read + publish), {GPUS} GPUs: median",
            median(poll) * 1e6,
            "us",
            median(baseline) * 1e6,
            base,
            "report",
        ),
        Row(
            f"nvml calls per read, {GPUS} GPUs (first of a session: {figures.first_calls})",
            calls,
            "",
            GPUS,
            base,
            "report",
        ),
        Row(
            "nvml read beyond its NVML calls (estimate)",
            (median(read) - calls * per_call) * 1e6,
            "us",
            target="report",
        ),
    ]


def main() -> None:
    print_rows(rows())


if __name__ == "__main__":
    main()
