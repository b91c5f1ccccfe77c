"""`kvcap-exporter nvml-check`: the nvml collector's figures beside nvidia-smi's, per GPU.

A diagnostic for users: run it where the sidecar runs (the image has it), with the same
`--nvml.*` flags or KVCAP_NVML_* variables, to see what the collector would export and
whether nvidia-smi agrees. Exit status: 0 when every figure agrees, 1 when one does not,
2 when NVML or nvidia-smi is not available.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import time
from typing import Any

from exporter.collectors import NvmlSession, load_library, parse_visible_devices
from exporter.collectors.nvml_reader import NVMLError
from exporter.flags import Flags
from exporter.state import GpuReport

FIELDS = (
    "index,uuid,name,pci.bus_id,driver_version,memory.total,memory.used,memory.free,memory.reserved"
)
MIB = 2**20


def nvidia_smi() -> dict[str, list[str]] | None:
    """nvidia-smi's row of each GPU, by UUID; None without nvidia-smi."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    fields = FIELDS
    run = subprocess.run(
        [binary, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode != 0 and "memory.reserved" in run.stdout + run.stderr:
        fields = FIELDS.removesuffix(",memory.reserved")  # nvidia-smi before driver 510
        run = subprocess.run(
            [binary, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            check=False,
        )
    if run.returncode != 0:
        print(f"nvidia-smi failed: {run.stdout}{run.stderr}")
        return None
    rows = [[cell.strip() for cell in line.split(",")] for line in run.stdout.splitlines()]
    return {row[1]: row + ["n/a"] * (9 - len(row)) for row in rows if len(row) >= 8}


def compare(gpu: GpuReport, row: list[str]) -> list[tuple[str, str, str, bool]]:
    """(field, collector, nvidia-smi, agrees) for one GPU. Memory in MiB, as nvidia-smi
    prints it; used and free move while the two read, so they may differ by 1% of total."""
    live_mib = max(1, gpu.memory_total_bytes // MIB // 100)

    def mib(value: int | None, smi: str, slack: int) -> tuple[str, str, bool]:
        if value is None or not smi.isdigit():  # both unavailable agree: "[N/A]", "n/a"
            mine = "n/a" if value is None else str(value // MIB)
            return mine, smi, value is None and smi != "-" and not smi.isdigit()
        return str(value // MIB), smi, abs(value // MIB - int(smi)) <= slack

    return [
        ("index", gpu.index, row[0], gpu.index == row[0]),
        ("uuid", gpu.uuid, row[1], gpu.uuid == row[1]),
        ("name", gpu.name, row[2], gpu.name == row[2]),
        ("pci.bus_id", gpu.pci_bus_id, row[3], gpu.pci_bus_id.lower() == row[3].lower()),
        ("driver_version", gpu.driver_version, row[4], gpu.driver_version == row[4]),
        ("memory.total", *mib(gpu.memory_total_bytes, row[5], 1)),
        ("memory.used", *mib(gpu.memory_used_bytes, row[6], live_mib)),
        ("memory.free", *mib(gpu.memory_free_bytes, row[7], live_mib)),
        ("memory.reserved", *mib(gpu.memory_reserved_bytes, row[8], 1)),
    ]


def timed_reads(session: NvmlSession, rounds: int) -> str:
    durations = []
    for _ in range(rounds):
        began = time.perf_counter()
        session.read()
        durations.append(time.perf_counter() - began)
    ordered = sorted(durations)
    median, p99 = statistics.median(ordered), ordered[int(len(ordered) * 0.99)]
    return f"median {median * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms over {rounds} reads"


# A diagnostic, not a benchmark: 100,000 reads of 8 GPUs take about a minute.
MAX_ROUNDS = 100_000


def _rounds(text: str) -> int:
    rounds = int(text)
    if not 1 <= rounds <= MAX_ROUNDS:
        raise argparse.ArgumentTypeError(f"{rounds} is not between 1 and {MAX_ROUNDS:,}")
    return rounds


def add_parser(subparsers: Any) -> Flags:
    parser = subparsers.add_parser(
        "nvml-check", help="compare the nvml collector's GPU figures with nvidia-smi's"
    )
    flags = Flags(parser)
    group = flags.group("nvml-check")
    group.add(
        "--nvml.visible-devices",
        "--visible-devices",
        metavar="DEVICES",
        default_text="this process's CUDA_VISIBLE_DEVICES if set, else every GPU",
        help="the GPUs to read, as serve's flag of the same name",
    )
    group.add(
        "--nvml.library",
        "--library",
        metavar="FILE",
        default_text="the dynamic loader's search",
        help="path of libnvidia-ml.so.1",
    )
    group.add(
        "--rounds",
        metavar="COUNT",
        type=_rounds,
        default=200,
        env=False,
        help=f"reads to time, 1 to {MAX_ROUNDS:,}",
    )
    parser.set_defaults(handler=run, flags=flags)
    return flags


def run(args: argparse.Namespace) -> int:
    visible_text = args.nvml_visible_devices or os.environ.get("CUDA_VISIBLE_DEVICES")
    visible = parse_visible_devices(visible_text) if visible_text else None
    try:
        load_library(args.nvml_library)
        session = NvmlSession(visible)
    except NVMLError as error:
        print(f"NVML is not available: {error}")
        return 2
    try:
        reading = session.read()
        timing = timed_reads(session, args.rounds)
    finally:
        session.close()
    print(f"driver {session.driver_version}, {session.gpu_count} GPUs; visible: {visible or 'all'}")
    print(f"collector read of {len(reading.gpus)} devices: {timing}")
    for failure in reading.failures:
        print(f"FAILED {failure.device}: {failure.reason}: {failure.message}")
    rows = nvidia_smi()
    agree = not reading.failures
    for gpu in reading.gpus:
        print(f"\nGPU {gpu.index} (visible index {gpu.visible_index}, MIG device {gpu.mig_mode})")
        processes = ", ".join(f"{p.pid}: {p.used_bytes // MIB} MiB" for p in gpu.processes)
        print(f"  processes: {processes or 'none visible'}")
        row = rows.get(gpu.uuid) if rows is not None else None
        if row is None:  # no nvidia-smi, or a MIG device (--query-gpu lists GPUs only)
            row = ["-"] * 9
        print(f"  {'field':16} {'collector':>42} {'nvidia-smi':>42}")
        for field, mine, theirs, same in compare(gpu, row):
            agree = agree and (same or theirs == "-")
            verdict = "ok" if same else "-" if theirs == "-" else "DIFFERENT"
            print(f"  {field:16} {mine:>42} {theirs:>42}  {verdict}")
    if rows is None:
        return 2
    print("\nall figures agree" if agree else "\nsome figures differ")
    return 0 if agree else 1
