"""The process_* series, read as prometheus_client's ProcessCollector reads them and written
straight to text (its families and generate_latest cost more than the reads)."""

from __future__ import annotations

import os
import resource
from collections.abc import Callable

from exporter.exposition.text import header_text, sample_value

_PREFIX = "process_"
# (name, help, kind) in ProcessCollector's order.
_STAT_FAMILIES = (
    ("virtual_memory_bytes", "Virtual memory size in bytes.", "gauge"),
    ("resident_memory_bytes", "Resident memory size in bytes.", "gauge"),
    ("start_time_seconds", "Start time of the process since unix epoch in seconds.", "gauge"),
    ("cpu_seconds", "Total user and system CPU time spent in seconds.", "counter"),
)
_FD_FAMILIES = (
    ("open_fds", "Number of open file descriptors.", "gauge"),
    ("max_fds", "Maximum number of open file descriptors.", "gauge"),
)


class ProcessText:
    """The process_* families of one process (this one by default), as text per scrape."""

    def __init__(self, pid: Callable[[], int | str] = lambda: "self", proc: str = "/proc"):
        self._pid = pid
        self._proc = proc
        self._ticks = float(os.sysconf("SC_CLK_TCK"))
        self._pagesize = resource.getpagesize()
        self._btime = _boot_time(proc)
        self._headers = {
            openmetrics: {
                name: header_text(_PREFIX + name, help_text, kind, openmetrics=openmetrics)
                for name, help_text, kind in (*_STAT_FAMILIES, *_FD_FAMILIES)
            }
            for openmetrics in (False, True)
        }

    def text(self, openmetrics: bool) -> str:
        """Nothing where /proc cannot be read, as ProcessCollector yields nothing there."""
        if not self._btime:
            return ""
        pid = os.path.join(self._proc, str(self._pid()).strip())
        headers = self._headers[openmetrics]
        lines = []
        try:
            with open(os.path.join(pid, "stat"), "rb") as stat:
                parts = stat.read().split(b")")[-1].split()
            utime, stime = float(parts[11]) / self._ticks, float(parts[12]) / self._ticks
            values = (
                float(parts[20]),
                float(parts[21]) * self._pagesize,
                float(parts[19]) / self._ticks + self._btime,
                utime + stime,
            )
            for (name, _, kind), value in zip(_STAT_FAMILIES, values, strict=True):
                shown = _PREFIX + name + ("_total" if kind == "counter" else "")
                lines.append(f"{headers[name]}{shown} {sample_value(value)}\n")
        except OSError:
            pass
        try:
            max_fds = _max_fds(os.path.join(pid, "limits"))
            open_fds = len(os.listdir(os.path.join(pid, "fd")))
            for name, value in (("open_fds", open_fds), ("max_fds", max_fds)):
                lines.append(f"{headers[name]}{_PREFIX}{name} {sample_value(value)}\n")
        except OSError:
            pass
        return "".join(lines)


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
    with open(path, "rb") as limits:
        for line in limits:
            if line.startswith(b"Max open file"):
                return float(line.split()[3])
    raise OSError(f"{path}: no 'Max open files' line")
