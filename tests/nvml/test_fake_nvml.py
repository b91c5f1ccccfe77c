"""The test NVML library answers nvidia-ml-py the way NVML does, for the calls kvcap makes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pynvml  # type: ignore[import-untyped]
import pytest

from exporter.collectors import NvmlSession
from tools.nvml.fake import (
    DRIVER_NOT_LOADED,
    FUNCTION_NOT_FOUND,
    GIB,
    FakeMig,
    FakeNvml,
    FakeNvmlConfig,
    FakeProcess,
    eight_h200s,
)

pytest_plugins = ["tests.nvml.fixtures"]

# Every NVML symbol the library defines; the test below checks the binding calls no other
# for what kvcap reads, and calls each of these on some path.
NVML_SYMBOLS = {
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlErrorString",
    "nvmlSystemGetDriverVersion",
    "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex_v2",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetName",
    "nvmlDeviceGetPciInfo_v3",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceGetGpuInstanceId",
}


@pytest.fixture
def nvml(fake_nvml: FakeNvml) -> Iterator[FakeNvml]:
    """The library with 8 GPUs, initialised for the test."""
    fake_nvml.write(eight_h200s())
    pynvml.nvmlInit()
    yield fake_nvml
    pynvml.nvmlShutdown()


def test_kvcap_calls_exactly_the_symbols_the_library_defines(
    fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch
) -> None:
    called: set[str] = set()
    lookup = pynvml._nvmlGetFunctionPointer

    def record(name: str) -> Any:
        called.add(name)
        return lookup(name)

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", record)
    config = eight_h200s().with_gpu(3, mig="1")
    fake_nvml.write(replace(config, migs=(FakeMig(3, 1, "MIG-a"),)))
    session = NvmlSession(None)
    session.read()
    # An older driver: the v1 memory struct and the _v2 process query.
    fake_nvml.write(
        replace(
            config,
            failures={
                "nvmlDeviceGetMemoryInfo_v2": FUNCTION_NOT_FOUND,
                "nvmlDeviceGetComputeRunningProcesses_v3": FUNCTION_NOT_FOUND,
            },
        )
    )
    session.read()
    session.close()
    assert called - {"nvmlErrorString"} == NVML_SYMBOLS - {"nvmlErrorString"}
    for symbol in NVML_SYMBOLS:
        assert hasattr(pynvml.nvmlLib, symbol)


def test_identity_and_memory(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(2)
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlDeviceGetUUID(handle) == "GPU-00000002-1111-2222-3333-000000000002"
    assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA H200"
    assert pynvml.nvmlDeviceGetPciInfo(handle).busId == "00000000:3A:00.0"
    v2 = pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(handle)
    assert v2.total == v1.total == v2.reserved + v2.used + v2.free
    assert v1.used == v2.used + v2.reserved  # v1 counts the reserved memory as used
    assert v2.used == 122 * GIB


def test_processes_grow_the_buffer_and_mark_unknown_sizes(nvml: FakeNvml) -> None:
    processes = tuple(FakeProcess("0", 100 + i, i * GIB) for i in range(20))
    nvml.write(replace(eight_h200s(), processes=(*processes, FakeProcess("0", 999, None))))
    infos = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert [info.pid for info in infos] == [*range(100, 120), 999]
    assert infos[-1].usedGpuMemory is None
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(1)) == []


def test_errors_are_the_bindings_exception_classes(nvml: FakeNvml) -> None:
    handle = pynvml.nvmlDeviceGetHandleByIndex(5)
    nvml.write(eight_h200s().with_gpu(5, error=15))
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetMemoryInfo(handle)
    with pytest.raises(pynvml.NVMLError_GpuIsLost, match="GPU is lost"):
        pynvml.nvmlDeviceGetHandleByIndex(5)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(8)


def test_init_errors_and_calls_before_init(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(FakeNvmlConfig(init_error=DRIVER_NOT_LOADED))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    fake_nvml.config_path.unlink()  # no config: no driver
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    assert fake_nvml.init_refcount() == 0


def test_mig_devices(nvml: FakeNvml) -> None:
    migs = (FakeMig(4, 2, "MIG-two"), FakeMig(4, 5, "MIG-five"))
    nvml.write(replace(eight_h200s().with_gpu(4, mig="1").with_gpu(6, mig="na"), migs=migs))
    gpu = pynvml.nvmlDeviceGetHandleByIndex(4)
    assert pynvml.nvmlDeviceGetMigMode(gpu) == [1, 1]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu) == 7
    first = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
    assert pynvml.nvmlDeviceGetGpuInstanceId(first) == 2
    assert pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 1)) == (
        "MIG-five"
    )
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 2)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(6))
    assert pynvml.nvmlDeviceGetMigMode(pynvml.nvmlDeviceGetHandleByIndex(0)) == [0, 0]


@pytest.mark.process
def test_the_binding_finds_the_library_on_ld_library_path(fake_nvml: FakeNvml) -> None:
    """Its other use: a subprocess whose pynvml opens libnvidia-ml.so.1 by name."""
    fake_nvml.write(eight_h200s())
    code = (
        "import pynvml; pynvml.nvmlInit(); "
        "print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlSystemGetDriverVersion()); "
        "pynvml.nvmlShutdown()"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **fake_nvml.environment()},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["8", "550.54.15"]
