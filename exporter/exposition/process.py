"""The process_* families: this process's /proc read as prometheus_client's ProcessCollector
reads it, declared as a table like every other family and read afresh on each scrape."""

from __future__ import annotations

import os
import resource
from collections.abc import Callable
from dataclasses import dataclass

from exporter.exposition.columns import Column, Table, live_gauge

# /proc/<pid>/stat and limits are well under this; one read takes either whole.
_PROC_FILE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """One reading of a process; None where /proc could not be read (the family is then
    left out, as ProcessCollector leaves it out)."""

    virtual_memory_bytes: float | None = None
    resident_memory_bytes: float | None = None
    start_time_seconds: float | None = None
    cpu_seconds: float | None = None
    open_fds: float | None = None
    max_fds: float | None = None


class ProcessReader:
    """Reads one process (this one by default) from /proc."""

    def __init__(self, pid: Callable[[], int | str] = lambda: "self", proc: str = "/proc"):
        self._pid = pid
        self._proc = proc
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._pagesize = resource.getpagesize()
        self._btime = _boot_time(proc)

    def rows(self) -> list[ProcessReading]:
        """The reading, or none where /proc cannot be read at all."""
        if not self._btime:
            return []
        pid = os.path.join(self._proc, str(self._pid()).strip())
        stat: dict[str, float] = {}
        try:
            parts = _read(os.path.join(pid, "stat")).split(b")")[-1].split()
            utime, stime = float(parts[11]) / self._ticks, float(parts[12]) / self._ticks
            stat = {
                "virtual_memory_bytes": float(parts[20]),
                "resident_memory_bytes": float(parts[21]) * self._pagesize,
                "start_time_seconds": float(parts[19]) / self._ticks + self._btime,
                "cpu_seconds": utime + stime,
            }
        except OSError:
            pass
        fds: dict[str, float] = {}
        try:
            max_fds = _max_fds(os.path.join(pid, "limits"))
            fds = {"open_fds": self._open_fds(os.path.join(pid, "fd")), "max_fds": max_fds}
        except OSError:
            pass
        return [ProcessReading(**stat, **fds)]

    def _open_fds(self, folder: str) -> int:
        """The number of open descriptors. Linux 6.2 and later give it as the size of
        /proc/<pid>/fd: one system call. Listing the folder lets go of the interpreter lock
        around every entry, and while a poll ran a scrape waited to take it back once per
        open descriptor. Elsewhere (older kernels say 0; a folder standing in for /proc in
        tests) the listing counts, which, as prometheus_client's, includes the descriptor
        the listing opens."""
        if self._proc == "/proc":
            count = os.stat(folder).st_size
            if count > 0:
                return count
        return len(os.listdir(folder))


PROCESS: Table[ProcessReading] = Table(
    (),
    lambda _: (),
    (
        live_gauge(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            lambda r: r.virtual_memory_bytes,
        ),
        live_gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            lambda r: r.resident_memory_bytes,
        ),
        live_gauge(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            lambda r: r.start_time_seconds,
        ),
        Column(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            lambda r: r.cpu_seconds,
            kind="counter",
            live=True,
        ),
        live_gauge(
            "process_open_fds",
            "Number of open file descriptors.",
            lambda r: r.open_fds,
        ),
        live_gauge(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            lambda r: r.max_fds,
        ),
    ),
)


def _boot_time(proc: str) -> float:
    try:
        with open(os.path.join(proc, "stat"), "rb") as stat:
            for line in stat:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def _max_fds(path: str) -> float:
    for line in _read(path).splitlines():
        if line.startswith(b"Max open file"):
            return float(line.split()[3])
    raise OSError(f"{path}: no 'Max open files' line")


def _read(path: str) -> bytes:
    """A small /proc file in three system calls (a buffered `open` and read take six or
    more, and each lets another thread take the interpreter lock; see _open_fds)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        return os.read(descriptor, _PROC_FILE_BYTES)
    finally:
        os.close(descriptor)
