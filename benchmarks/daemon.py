"""The daemon as a process: start-up time, idle and busy memory and CPU.

Busy = 64 engines behind one simulated vLLM API server, polled every second, while a
client scrapes /metrics 10 times a second; measured twice, without the engines' KV events
and with them (each engine publishes a batch every 0.2 s and keeps 1,280 blocks resident:
512 in its full-attention group, 128 in each of its 6 sliding-window groups; the
kv_events collector follows all 64). Figures come from /proc of the daemon; the
busy RSS is the peak of the samples taken every second.
Run: .venv/bin/python -m benchmarks.daemon
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import Row, print_rows
from exporter.demo import simulated_deployment
from exporter.logs import configure_logging
from tools.probe import free_port

BUSY_SECONDS = 30.0
ENGINES = 64
# Targets of the busy daemon (docs/performance.md): without KV events, and what each
# followed engine and each resident block of its prefix cache may add with them
# (docs/reliability.md's budget). Fitted from busy runs at 20 to 2,560 blocks per engine
# (benchmarks/kv_events_cost.py, three runs on 2026-12-02): 224-281 KiB per engine of 7 KV
# cache groups (libzmq's sockets and pipes ~60 KiB, the exposition of its 152 residency
# series, malloc's arenas) and 115-132 B per block (a 64-bit int key and a dict entry:
# under churn CPython sizes a dict's entries at 2 to 4 x the blocks held). The budgets are
# over the highest fit of the three (a run's peak is 0.2-3 MiB over its median, so one
# run's fit moves by ~50 KiB an engine).
BUSY_RSS_TARGET_MIB = 45.0
BUSY_CPU_TARGET = 0.06
ENGINE_KIB = 320
RESIDENT_BLOCK_BYTES = 144


def kv_events_allowance_mib(engines: int, blocks: int) -> float:
    """What following `engines` KV event streams with `blocks` resident may add to RSS."""
    return (engines * ENGINE_KIB * 1024 + blocks * RESIDENT_BLOCK_BYTES) / 2**20


def proc_figures(pid: int) -> tuple[float, float, int]:
    """(RSS MiB, CPU seconds used, threads) of a process."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    rss = int(next(line.split()[1] for line in status if line.startswith("VmRSS"))) / 1024
    threads = int(next(line.split()[1] for line in status if line.startswith("Threads")))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return rss, cpu, threads


def start_daemon(
    port: int, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "serve",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--handshake.listen",
            "tcp://127.0.0.1:0",
            "--log.level",
            "warn",
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


def scrape(port: int) -> bool:
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        connection.request("GET", "/metrics")
        ok = connection.getresponse().status == 200
        connection.close()
        return ok
    except OSError:
        return False


def startup_seconds() -> float:
    port = free_port()
    began = time.perf_counter()
    process = start_daemon(port)
    try:
        while not scrape(port):
            time.sleep(0.01)
        return time.perf_counter() - began
    finally:
        process.terminate()
        process.wait(5)


@contextmanager
def daemon_watching(
    engines: int, *flags: str, kv_events: bool = True, working_set: int | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A serving daemon process (with `flags`) polling a simulated `engines`-engine vLLM
    every second (publishing KV events or not; `working_set`: the blocks each engine's
    full-attention group keeps, the simulation's default if None); yields the process and
    its port, and stops both afterwards."""
    with tempfile.TemporaryDirectory() as directory:
        simulation = simulated_deployment(Path(directory) / "gemma", data_parallel_size=engines)
        simulation.kv_events = kv_events
        if working_set is not None:
            simulation.kv_events_working_set = working_set
        url = simulation.start()
        port = free_port()
        process = start_daemon(
            port, "--vllm.url", url, "--vllm.poll-interval", "1",
            "--vllm.args", simulation.vllm_args, *flags,
        )  # fmt: skip
        try:
            while not scrape(port):
                time.sleep(0.05)
            yield process, port
        finally:
            process.terminate()
            process.wait(5)
            simulation.stop()


@dataclass(frozen=True, slots=True)
class Busy:
    """One busy run: start-up RSS, peak RSS, CPU share, threads, failed scrapes, and the
    prefix-cache blocks resident at its end."""

    start_rss_mib: float
    peak_rss_mib: float
    cpu_share: float
    threads: int
    failures: int
    resident_blocks: int


def resident_blocks(port: int) -> int:
    """The sum of kvcap_prefix_cache_resident_blocks in one scrape."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/metrics")
    body = connection.getresponse().read().decode()
    connection.close()
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in body.splitlines()
            if line.startswith("kvcap_prefix_cache_resident_blocks{")
        )
    )


def busy_run(seconds: float = BUSY_SECONDS, *, kv_events: bool) -> Busy:
    """`seconds` of 10 scrapes a second against a daemon following 64 engines."""
    with daemon_watching(ENGINES, kv_events=kv_events) as (process, port):
        time.sleep(2)
        start_rss, cpu_before, _ = proc_figures(process.pid)
        peak_rss = start_rss
        began = time.monotonic()
        failures = 0
        while time.monotonic() - began < seconds:
            for _ in range(10):
                failures += not scrape(port)
                time.sleep(0.1)
            peak_rss = max(peak_rss, proc_figures(process.pid)[0])
        rss, cpu_after, threads = proc_figures(process.pid)
        cpu_share = (cpu_after - cpu_before) / (time.monotonic() - began)
        blocks = resident_blocks(port)
        return Busy(start_rss, max(peak_rss, rss), cpu_share, threads, failures, blocks)


def busy_rows(run: Busy, kv_events: bool) -> list[Row]:
    load = f"{ENGINES} engines, 1 s polling, 10 scrapes/s"
    if not kv_events:
        return [
            Row(
                f"busy RSS, peak ({load})",
                run.peak_rss_mib,
                "MiB",
                target=f"<= {BUSY_RSS_TARGET_MIB:g} MiB",
                passed=run.peak_rss_mib <= BUSY_RSS_TARGET_MIB,
            ),
            Row(
                f"busy CPU ({load})",
                run.cpu_share * 100,
                "%",
                target=f"<= {BUSY_CPU_TARGET:.0%} of one core",
                passed=run.cpu_share <= BUSY_CPU_TARGET,
            ),
            Row("busy scrapes failed", run.failures, "", target="0", passed=run.failures == 0),
            Row("daemon threads while busy", run.threads, "", target="report"),
            Row(f"RSS after start-up with {ENGINES} engines", run.start_rss_mib, "MiB"),
        ]
    allowed = BUSY_RSS_TARGET_MIB + kv_events_allowance_mib(ENGINES, run.resident_blocks)
    return [
        Row(
            f"busy RSS with KV events, peak ({run.resident_blocks:,} blocks resident)",
            run.peak_rss_mib,
            "MiB",
            target=f"<= {allowed:.1f} MiB",
            passed=run.peak_rss_mib <= allowed,
        ),
        Row(f"busy CPU with KV events ({load})", run.cpu_share * 100, "%", target="report"),
        Row(
            "busy scrapes failed, with KV events",
            run.failures,
            "",
            target="0",
            passed=run.failures == 0,
        ),
    ]


def rows() -> list[Row]:
    configure_logging("warn")
    started = startup_seconds()
    return [
        Row("start to first successful /metrics", started, "s", target="< 2 s", passed=started < 2),
        *busy_rows(busy_run(kv_events=False), kv_events=False),
        *busy_rows(busy_run(kv_events=True), kv_events=True),
    ]


def main() -> None:
    print_rows(rows())


if __name__ == "__main__":
    main()
