"""Collector `nvml`: memory of the GPUs the engines use, through NVML (nvidia-ml-py).

GPUs are published in the order of the visible devices (the vLLM container's
CUDA_VISIBLE_DEVICES), which is how vLLM's workers number them. No driver is "no data",
not an error: the collector then registers no target, so readiness does not wait for it.
"""

from __future__ import annotations

import argparse
import os
import random
import threading
import time
from dataclasses import dataclass

import structlog

from exporter.collectors.nvml_reader import (
    GpuReading,
    NVMLError,
    NvmlSession,
    error_reason,
    load_library,
    parse_visible_devices,
)
from exporter.collectors.registry import CollectorSpec, register_collector
from exporter.flags import FieldFlag, FlagGroup, duration, field_values
from exporter.state import StateSink

log = structlog.get_logger("kvcap.nvml")

NAME = "nvml"
TARGET = "local"


@dataclass(frozen=True, slots=True)
class NvmlSettings:
    poll_interval_s: float = 5.0
    # CUDA_VISIBLE_DEVICES entries in the engines' order; None: every GPU in index order.
    visible_devices: tuple[str, ...] | None = None
    # The NVML library to load; None: the binding's own search for libnvidia-ml.so.1.
    library_path: str | None = None
    max_backoff_s: float = 300.0


class NvmlCollector:
    """One thread: initialises NVML, reads the GPUs every poll interval, and re-initialises
    with exponential backoff when the driver or a GPU stops answering."""

    name = NAME

    def __init__(self, settings: NvmlSettings) -> None:
        self.settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, sink: StateSink) -> None:
        poller = NvmlPoller(self.settings, sink, self._stop)
        self._thread = threading.Thread(target=poller.run, name="nvml", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)


class NvmlPoller:
    """The collector's loop, one poll at a time (tests drive `poll_once` directly)."""

    def __init__(self, settings: NvmlSettings, sink: StateSink, stop: threading.Event) -> None:
        self.settings = settings
        self.sink = sink
        self.stop = stop
        self.session: NvmlSession | None = None
        self.registered = False  # a target exists once NVML has initialised
        self.announced_no_driver = False
        self.open_failures = 0
        self.reopen_failures = 0
        self.reopen_at = 0.0
        self.failing: set[str] = set()  # visible-devices entries whose last read failed
        self.warned_not_found: set[str] = set()
        self.widths: dict[str, int] = {}

    def run(self) -> None:
        delay_s = 0.0
        try:
            while not self.stop.wait(delay_s):
                delay_s = self.poll_safely()
        finally:
            self.close()

    def poll_safely(self) -> float:
        """poll_once, where an unexpected error is a failed read, not the end of the thread
        (which would stop GPU metrics for good); NVML is re-initialised after it."""
        try:
            return self.poll_once()
        except Exception as error:
            log.exception("nvml_poll_failed")
            if self.registered:
                self.sink.fail(NAME, TARGET, "internal", repr(error))
            self.close()
            self.open_failures += 1
            return self._backoff_s(self.open_failures)

    def close(self) -> None:
        if self.session is not None:
            self.widths = self.session.widths
            self.session.close()
            self.session = None

    def poll_once(self) -> float:
        """One read (or init attempt); returns the seconds to wait before the next."""
        if self.session is None and not self._open():
            return self._backoff_s(self.open_failures)
        assert self.session is not None
        began = time.monotonic()
        reading = self.session.read()
        self._publish(reading, began)
        if reading.failures and time.monotonic() >= self.reopen_at:
            # A lost GPU comes back (after a reset) only with fresh handles.
            self.close()
            self.reopen_failures += 1
            self.reopen_at = time.monotonic() + self._backoff_s(self.reopen_failures)
            if not self._open():
                return self._backoff_s(self.open_failures)
        elif not reading.failures:
            self.reopen_failures = 0
            self.reopen_at = 0.0
        return self.settings.poll_interval_s

    def _open(self) -> bool:
        try:
            load_library(self.settings.library_path)
            session = NvmlSession(self.settings.visible_devices, self.widths)
        except NVMLError as error:
            self.open_failures += 1
            if self.registered:
                self.sink.fail(NAME, TARGET, error_reason(error), f"nvmlInit: {error}")
            elif not self.announced_no_driver:
                self.announced_no_driver = True
                log.info("nvml_no_driver", error=str(error))
            return False
        self.session = session
        self.open_failures = 0
        if not self.registered:
            self.registered = True
            self.sink.register_target(NAME, TARGET)
            log.info(
                "nvml initialised",
                driver_version=session.driver_version,
                gpus=session.gpu_count,
                visible_devices=",".join(session.visible) if session.visible is not None else "all",
            )
        return True

    def _publish(self, reading: GpuReading, began: float) -> None:
        if reading.not_found is not None and reading.not_found not in self.warned_not_found:
            self.warned_not_found.add(reading.not_found)
            log.warning(
                "visible device not found; later devices ignored, as CUDA does",
                device=reading.not_found,
            )
        failed = {failure.device: failure for failure in reading.failures}
        for device in failed.keys() - self.failing:
            log.warning("gpu_failed", device=device, error=failed[device].message)
        for device in self.failing - failed.keys():
            log.info("gpu_recovered", device=device)
        self.failing = set(failed)
        if reading.failures and not reading.gpus:
            message = "; ".join(failure.message for failure in reading.failures)
            reason = reading.failures[0].reason
            self.sink.fail(NAME, TARGET, reason, message, duration_s=_since(began))
            return
        for failure in reading.failures:
            self.sink.reject(NAME, TARGET, failure.reason, failure.message)
        self.sink.publish_gpus(NAME, TARGET, reading.gpus, duration_s=_since(began))

    def _backoff_s(self, failures: int) -> float:
        interval = self.settings.poll_interval_s
        backoff = min(self.settings.max_backoff_s, interval * 2.0 ** max(failures - 1, 0))
        return backoff * random.uniform(0.5, 1.0)  # jitter spreads the retries of many sidecars


def _since(began: float) -> float:
    return time.monotonic() - began


# The flags that set a settings field as given; --nvml.visible-devices, between them in
# --help, is read apart (its default is this process's CUDA_VISIBLE_DEVICES).
_POLL_FLAG = FieldFlag(
    "--nvml.poll-interval",
    "poll_interval_s",
    "time between GPU reads: 5s, 250ms, 1m or seconds",
    type=duration,
)
_LIBRARY_FLAG = FieldFlag(
    "--nvml.library",
    "library_path",
    "path of libnvidia-ml.so.1",
    metavar="FILE",
    default_text="the dynamic loader's search",
)


def _add_arguments(group: FlagGroup) -> None:
    defaults = NvmlSettings()
    group.add_fields((_POLL_FLAG,), defaults)
    group.add(
        "--nvml.visible-devices",
        metavar="DEVICES",
        default_text="this process's CUDA_VISIBLE_DEVICES if set, else every GPU in index order",
        help="the vLLM container's CUDA_VISIBLE_DEVICES: comma-separated GPU indices or "
        "UUIDs, in the order its workers number them",
    )
    group.add_fields((_LIBRARY_FLAG,), defaults)


def _build(args: argparse.Namespace) -> NvmlCollector:
    visible = args.nvml_visible_devices
    if visible is None:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return NvmlCollector(
        NvmlSettings(
            visible_devices=parse_visible_devices(visible) if visible is not None else None,
            **field_values(args, (_POLL_FLAG, _LIBRARY_FLAG)),
        )
    )


register_collector(
    CollectorSpec(
        name=NAME,
        help="read GPU memory, processes and MIG devices through NVML",
        default_enabled=True,
        add_arguments=_add_arguments,
        build=_build,
    )
)
