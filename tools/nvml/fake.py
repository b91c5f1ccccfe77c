"""The test NVML library's config as values, and a writer tests rewrite it with."""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

GIB = 2**30
H200_TOTAL = 143_771_336_704  # what NVML reports for an H200 (141 GB)
H200_RESERVED = 512 * 2**20

# NVML return codes (nvml.h) that tests inject.
GPU_IS_LOST = 15
DRIVER_NOT_LOADED = 9
FUNCTION_NOT_FOUND = 13
NOT_SUPPORTED = 3
NO_PERMISSION = 4
UNKNOWN = 999


@dataclass(frozen=True, slots=True)
class FakeGpu:
    index: int
    uuid: str
    name: str = "NVIDIA H200"
    pci_bus_id: str = "00000000:18:00.0"
    total: int = H200_TOTAL
    used: int = 0
    reserved: int = H200_RESERVED
    error: int = 0  # every call on the GPU returns this code (15: lost)
    mig: str = "0"  # "0", "1", or "na": nvmlDeviceGetMigMode is not supported

    @property
    def free(self) -> int:
        return self.total - self.reserved - self.used

    def line(self) -> str:
        return (
            f"gpu {self.index} uuid={self.uuid} name={self.name.replace(' ', '_')} "
            f"pci={self.pci_bus_id} total={self.total} used={self.used} free={self.free} "
            f"reserved={self.reserved} error={self.error} mig={self.mig}"
        )


@dataclass(frozen=True, slots=True)
class FakeMig:
    gpu: int
    instance: int  # the GPU instance id
    uuid: str
    name: str = "NVIDIA H200 MIG 3g.71gb"
    total: int = 70 * GIB
    used: int = 0
    reserved: int = 0

    @property
    def free(self) -> int:
        return self.total - self.reserved - self.used

    def line(self) -> str:
        return (
            f"mig {self.gpu} {self.instance} uuid={self.uuid} name={self.name.replace(' ', '_')} "
            f"total={self.total} used={self.used} free={self.free} reserved={self.reserved}"
        )


@dataclass(frozen=True, slots=True)
class FakeProcess:
    device: str  # "0", or "3/1" for MIG instance 1 of GPU 3
    pid: int
    used: int | None  # None: NVML_VALUE_NOT_AVAILABLE

    def line(self) -> str:
        return f"process {self.device} {self.pid} {'na' if self.used is None else self.used}"


@dataclass(frozen=True, slots=True)
class FakeNvmlConfig:
    driver: str = "550.54.15"
    init_error: int = 0
    gpus: tuple[FakeGpu, ...] = ()
    migs: tuple[FakeMig, ...] = ()
    processes: tuple[FakeProcess, ...] = ()
    failures: dict[str, int] = field(default_factory=dict)  # symbol -> return code

    def render(self) -> str:
        lines = [f"driver {self.driver}", f"init_error {self.init_error}"]
        lines += [f"fail {symbol} {code}" for symbol, code in self.failures.items()]
        lines += [gpu.line() for gpu in self.gpus] + [mig.line() for mig in self.migs]
        lines += [process.line() for process in self.processes]
        return "\n".join(lines) + "\n"

    def with_gpu(self, index: int, **changes: Any) -> FakeNvmlConfig:
        gpus = tuple(replace(g, **changes) if g.index == index else g for g in self.gpus)
        return replace(self, gpus=gpus)


def gpu_uuid(index: int) -> str:
    return f"GPU-{index:08x}-1111-2222-3333-{index:012x}"


def eight_h200s(used_gib: int = 120) -> FakeNvmlConfig:
    """An 8 x H200 node: distinct PCI addresses, vLLM-like usage, one process per GPU."""
    buses = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
    gpus = tuple(
        FakeGpu(
            index=i,
            uuid=gpu_uuid(i),
            pci_bus_id=f"00000000:{bus.upper()}:00.0",
            used=(used_gib + i) * GIB,
        )
        for i, bus in enumerate(buses)
    )
    processes = tuple(FakeProcess(str(i), 4000 + i, (used_gib + i) * GIB) for i in range(8))
    return FakeNvmlConfig(gpus=gpus, processes=processes)


class FakeNvml:
    """The built library and its config file; `write` replaces the file atomically, so a
    call in the library never reads half a file."""

    def __init__(self, library: Path, config_path: Path) -> None:
        self.library = library
        self.config_path = config_path
        self._hooks = ctypes.CDLL(str(library))
        self._hooks.fake_nvml_call_count.restype = ctypes.c_ulonglong

    def call_count(self) -> int:
        """NVML calls made so far in this process (all tests together)."""
        return int(self._hooks.fake_nvml_call_count())

    def init_refcount(self) -> int:
        """nvmlInit calls not yet matched by nvmlShutdown."""
        return int(self._hooks.fake_nvml_init_refcount())

    def write(self, config: FakeNvmlConfig) -> None:
        partial = self.config_path.with_suffix(".partial")
        partial.write_text(config.render(), encoding="utf-8")
        os.replace(partial, self.config_path)

    def environment(self) -> dict[str, str]:
        """For a subprocess: the library first on the loader's path, and the config."""
        return {
            "LD_LIBRARY_PATH": str(self.library.parent),
            "FAKE_NVML_CONFIG": str(self.config_path),
        }
