"""Reading GPUs through nvidia-ml-py: the visible devices, their memory, processes and MIG.

`NvmlSession` spans one nvmlInit .. nvmlShutdown. Identity (UUID, name, PCI bus id) is read
once per session, memory, processes and MIG devices on every read. A device that fails is
left out of that read and named in `GpuReading.failures`; the others still report.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml  # type: ignore[import-untyped]  # nvidia-ml-py ships no type information

from exporter.merging import alike_fields
from exporter.state import GpuProcessMemory, GpuReport

NVMLError: type[Exception] = pynvml.NVMLError

# Errors after which a GPU (or the driver) is not answering: drop the GPU, re-initialise.
_LOST = frozenset(
    {
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_RESET_REQUIRED,
        pynvml.NVML_ERROR_UNKNOWN,
        pynvml.NVML_ERROR_NOT_FOUND,
        pynvml.NVML_ERROR_GPU_NOT_FOUND,
        pynvml.NVML_ERROR_IRQ_ISSUE,
        pynvml.NVML_ERROR_UNINITIALIZED,
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
    }
)
# A query this GPU or driver does not offer: the field is left out, the GPU still reports.
_UNAVAILABLE = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION})
_OLDER_DRIVER = frozenset(
    {pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}
)


def error_code(error: Exception) -> int:
    """The NVML return code of an NVMLError."""
    return int(getattr(error, "value", pynvml.NVML_ERROR_UNKNOWN))


def error_reason(error: Exception) -> str:
    """The `reason` label of a failed read."""
    return "gpu_lost" if error_code(error) in _LOST else "nvml_error"


def parse_visible_devices(text: str) -> tuple[str, ...]:
    """CUDA's reading of CUDA_VISIBLE_DEVICES: comma-separated NVML indices or UUIDs
    (GPU-..., MIG-...; a unique prefix will do). CUDA ignores everything from the first
    entry it cannot use, so "0,1,-1,2" is GPUs 0 and 1, and "" or "none" is no GPU."""
    entries: list[str] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        entries.append(entry)
    return tuple(entries)


_library_lock = threading.Lock()
_libraries: dict[str, ctypes.CDLL] = {}  # by path: dlopen once, however often init is retried


def load_library(path: str | None) -> None:
    """Make nvidia-ml-py use the NVML library at `path`; None keeps the binding's own
    search (libnvidia-ml.so.1 through the dynamic loader). The binding holds one library
    per process, in `pynvml.nvmlLib`, which is why this sets a module global."""
    if path is None:
        return
    with _library_lock:
        if path not in _libraries:
            try:
                _libraries[path] = ctypes.CDLL(path)
            except OSError:
                raise NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND) from None
        with pynvml.libLoadLock:
            if pynvml.nvmlLib is not _libraries[path]:
                pynvml.nvmlLib = _libraries[path]
                # The binding caches function pointers by name: they are the old library's.
                pynvml._nvmlGetFunctionPointer_cache.clear()


@dataclass(frozen=True, slots=True)
class GpuFailure:
    """A visible device that could not be read this time."""

    device: str  # its visible-devices entry, or NVML index
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class GpuReading:
    gpus: tuple[GpuReport, ...]
    failures: tuple[GpuFailure, ...]
    # Visible-devices entries that match no GPU: CUDA stops at the first one.
    not_found: str | None = None


@dataclass(frozen=True, slots=True)
class _Identity:
    """What names a GPU; the fields are GpuReport's of the same names."""

    uuid: str
    name: str
    pci_bus_id: str


@dataclass(frozen=True, slots=True)
class _Memory:
    """A GPU's memory reading; the fields are GpuReport's of the same names."""

    memory_total_bytes: int
    memory_used_bytes: int
    memory_free_bytes: int
    memory_reserved_bytes: int | None = None  # the v2 memory struct only


class _NotVisible(Exception):
    """A visible-devices entry that names no GPU of this node."""


class NvmlSession:
    """NVML between nvmlInit and close(); reads the visible devices in their order."""

    def __init__(self, visible: tuple[str, ...] | None, widths: dict[str, int] | None = None):
        pynvml.nvmlInit()
        try:
            self.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
            self.gpu_count = int(pynvml.nvmlDeviceGetCount())
        except NVMLError:
            self.close()
            raise
        self.visible = visible
        # How many logical devices each entry was last (a MIG-enabled GPU is one per MIG
        # device), so that a failing entry keeps the later entries' positions.
        self.widths = dict(widths or {})
        self._handles: dict[int, Any] = {}
        self._identities: dict[int, _Identity] = {}
        self._memory_v2 = True
        self._processes: Callable[[Any], Any] = pynvml.nvmlDeviceGetComputeRunningProcesses_v3

    def close(self) -> None:
        with contextlib.suppress(NVMLError):  # already down with the driver
            pynvml.nvmlShutdown()

    def read(self) -> GpuReading:
        entries = self.visible if self.visible is not None else _indices(self.gpu_count)
        gpus: list[GpuReport] = []
        failures: list[GpuFailure] = []
        seen: set[str] = set()
        position = 0
        for entry in entries:
            try:
                found = self._read_entry(entry, position)
            except _NotVisible:
                return GpuReading(tuple(gpus), tuple(failures), not_found=entry)
            except NVMLError as error:
                failures.append(GpuFailure(entry, error_reason(error), f"GPU {entry}: {error}"))
                position += self.widths.get(entry, 1)
                continue
            self.widths[entry] = len(found)
            position += len(found)
            # A GPU named twice (by index and UUID) is reported once.
            gpus += [gpu for gpu in found if gpu.uuid not in seen]
            seen.update(gpu.uuid for gpu in found)
        return GpuReading(tuple(gpus), tuple(failures))

    def _read_entry(self, entry: str, position: int) -> list[GpuReport]:
        index, mig_uuid = self._resolve(entry)
        handle = self._handle(index)
        identity = self._identity(index)
        if mig_uuid is None and not self._mig_enabled(handle):
            return [self._report(handle, str(index), identity, position, mig=False)]
        reports: list[GpuReport] = []
        for instance, mig_handle in self._mig_devices(handle):
            mig_identity = _Identity(
                _text(pynvml.nvmlDeviceGetUUID(mig_handle)),
                _text(pynvml.nvmlDeviceGetName(mig_handle)),
                identity.pci_bus_id,
            )
            if mig_uuid is None or mig_identity.uuid == mig_uuid:
                label, at = f"{index}/{instance}", position + len(reports)
                reports.append(self._report(mig_handle, label, mig_identity, at, mig=True))
        return reports

    def _resolve(self, entry: str) -> tuple[int, str | None]:
        """(NVML index, MIG device UUID or None) of a visible-devices entry."""
        if entry.isdigit():
            if int(entry) >= self.gpu_count:
                raise _NotVisible(entry)
            return int(entry), None
        unreadable: Exception | None = None
        for index in range(self.gpu_count):
            try:
                if entry.startswith("GPU-"):
                    if self._identity(index).uuid.lower().startswith(entry.lower()):
                        return index, None
                    continue
                handle = self._handle(index)
                if not self._mig_enabled(handle):
                    continue
                for _, mig_handle in self._mig_devices(handle):
                    uuid = _text(pynvml.nvmlDeviceGetUUID(mig_handle))
                    if uuid.lower().startswith(entry.lower()):
                        return index, uuid
            except NVMLError as error:
                if unreadable is None:
                    unreadable = error  # perhaps the GPU we are looking for
        if unreadable is not None:
            raise unreadable
        raise _NotVisible(entry)

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = pynvml.nvmlDeviceGetHandleByIndex(index)
        return self._handles[index]

    def _identity(self, index: int) -> _Identity:
        if index not in self._identities:
            handle = self._handle(index)
            self._identities[index] = _Identity(
                _text(pynvml.nvmlDeviceGetUUID(handle)),
                _text(pynvml.nvmlDeviceGetName(handle)),
                _text(pynvml.nvmlDeviceGetPciInfo_v3(handle).busId),
            )
        return self._identities[index]

    def _mig_enabled(self, handle: Any) -> bool:
        try:
            current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        except NVMLError as error:
            if error_code(error) in _UNAVAILABLE | _OLDER_DRIVER:
                return False  # a GPU without MIG (before A100), or a driver before 450
            raise
        return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)

    def _mig_devices(self, handle: Any) -> list[tuple[int, Any]]:
        """(GPU instance id, handle) of each MIG device of a MIG-enabled GPU."""
        devices = []
        for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except NVMLError as error:
                if error_code(error) in (
                    pynvml.NVML_ERROR_NOT_FOUND,
                    pynvml.NVML_ERROR_INVALID_ARGUMENT,
                ):
                    continue  # an empty slot
                raise
            devices.append((int(pynvml.nvmlDeviceGetGpuInstanceId(mig_handle)), mig_handle))
        return devices

    def _report(
        self, handle: Any, label: str, identity: _Identity, position: int, *, mig: bool
    ) -> GpuReport:
        return GpuReport(
            index=label,
            **alike_fields(identity, GpuReport),
            driver_version=self.driver_version,
            **alike_fields(self._memory(handle), GpuReport),
            mig_mode=mig,
            processes=self._process_memory(handle),
            visible_index=position,
        )

    def _memory(self, handle: Any) -> _Memory:
        """The v2 struct (driver 510+) splits the reserved memory out of `used`; v1 has no
        reserved field."""
        if self._memory_v2:
            try:
                m = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
            except NVMLError as error:
                if error_code(error) in _OLDER_DRIVER:
                    self._memory_v2 = False
                elif error_code(error) not in _UNAVAILABLE:
                    raise
            else:
                return _Memory(int(m.total), int(m.used), int(m.free), int(m.reserved))
        m = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return _Memory(int(m.total), int(m.used), int(m.free))

    def _process_memory(self, handle: Any) -> tuple[GpuProcessMemory, ...]:
        try:
            infos = self._processes(handle)
        except NVMLError as error:
            older = pynvml.nvmlDeviceGetComputeRunningProcesses_v2
            if (
                error_code(error) == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
                and self._processes != older
            ):
                # Drivers before 510 have the _v2 query only (same struct).
                self._processes = older
                return self._process_memory(handle)
            if error_code(error) in _UNAVAILABLE:
                return ()
            raise
        by_pid: dict[int, int] = {}
        for info in infos:
            if info.usedGpuMemory is not None:  # None: not available (WDDM, some vGPUs)
                by_pid[int(info.pid)] = by_pid.get(int(info.pid), 0) + int(info.usedGpuMemory)
        return tuple(GpuProcessMemory(pid, used) for pid, used in sorted(by_pid.items()))


def _indices(count: int) -> tuple[str, ...]:
    return tuple(str(index) for index in range(count))


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
