"""NvmlSession through the real nvidia-ml-py and the test NVML library (tests/nvml)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from exporter.collectors import NvmlSession, parse_visible_devices
from exporter.state import GpuProcessMemory, GpuReport
from tools.nvml.fake import (
    FUNCTION_NOT_FOUND,
    GIB,
    GPU_IS_LOST,
    H200_RESERVED,
    H200_TOTAL,
    NO_PERMISSION,
    UNKNOWN,
    FakeMig,
    FakeNvml,
    FakeNvmlConfig,
    FakeProcess,
    eight_h200s,
    gpu_uuid,
)

pytest_plugins = ["tests.nvml.fixtures"]


@pytest.fixture
def nvml(fake_nvml: FakeNvml) -> FakeNvml:
    fake_nvml.write(eight_h200s())
    return fake_nvml


@pytest.fixture
def session(nvml: FakeNvml) -> Iterator[NvmlSession]:
    opened = NvmlSession(None)
    yield opened
    opened.close()


def indices(gpus: tuple[GpuReport, ...]) -> list[str]:
    return [gpu.index for gpu in gpus]


@pytest.mark.parametrize(
    ("text", "entries"),
    [
        ("0,1,2", ("0", "1", "2")),
        (" 3 , 1 ", ("3", "1")),
        ("GPU-8932f937,MIG-1b2c", ("GPU-8932f937", "MIG-1b2c")),
        ("0,1,-1,2", ("0", "1")),  # CUDA ignores everything from the first invalid entry
        ("", ()),
        ("none", ()),
        ("NoDevFiles", ()),
    ],
)
def test_parse_visible_devices(text: str, entries: tuple[str, ...]) -> None:
    assert parse_visible_devices(text) == entries


def test_eight_gpus_with_every_field(session: NvmlSession) -> None:
    reading = session.read()
    assert reading.failures == ()
    assert indices(reading.gpus) == [str(i) for i in range(8)]
    third = reading.gpus[2]
    assert third == GpuReport(
        index="2",
        uuid=gpu_uuid(2),
        name="NVIDIA H200",
        pci_bus_id="00000000:3A:00.0",
        driver_version="550.54.15",
        memory_total_bytes=H200_TOTAL,
        memory_used_bytes=122 * GIB,
        memory_free_bytes=H200_TOTAL - H200_RESERVED - 122 * GIB,
        memory_reserved_bytes=H200_RESERVED,
        mig_mode=False,
        processes=(GpuProcessMemory(4002, 122 * GIB),),
        visible_index=2,
    )
    assert len({gpu.uuid for gpu in reading.gpus}) == 8
    assert len({gpu.pci_bus_id for gpu in reading.gpus}) == 8


def test_memory_and_processes_change_between_reads(nvml: FakeNvml, session: NvmlSession) -> None:
    assert session.read().gpus[0].memory_used_bytes == 120 * GIB
    processes = (FakeProcess("0", 7, 50 * GIB), FakeProcess("0", 8, 1 * GIB))
    nvml.write(replace(eight_h200s().with_gpu(0, used=51 * GIB), processes=processes))
    first = session.read().gpus[0]
    assert first.memory_used_bytes == 51 * GIB
    assert first.memory_free_bytes == H200_TOTAL - H200_RESERVED - 51 * GIB
    assert first.processes == (GpuProcessMemory(7, 50 * GIB), GpuProcessMemory(8, GIB))


def test_processes_of_one_pid_are_summed_and_unknown_sizes_dropped(
    nvml: FakeNvml, session: NvmlSession
) -> None:
    processes = (FakeProcess("1", 7, GIB), FakeProcess("1", 7, GIB), FakeProcess("1", 9, None))
    nvml.write(replace(eight_h200s(), processes=processes))
    assert session.read().gpus[1].processes == (GpuProcessMemory(7, 2 * GIB),)


def test_processes_the_sidecar_may_not_see_leave_the_gpu_reporting(
    nvml: FakeNvml, session: NvmlSession
) -> None:
    failures = {"nvmlDeviceGetComputeRunningProcesses_v3": NO_PERMISSION}
    nvml.write(replace(eight_h200s(), failures=failures))
    reading = session.read()
    assert len(reading.gpus) == 8
    assert all(gpu.processes == () for gpu in reading.gpus)


def test_an_older_driver_gives_v1_memory_and_v2_processes(
    nvml: FakeNvml, session: NvmlSession
) -> None:
    failures = {
        "nvmlDeviceGetMemoryInfo_v2": FUNCTION_NOT_FOUND,
        "nvmlDeviceGetComputeRunningProcesses_v3": FUNCTION_NOT_FOUND,
    }
    nvml.write(replace(eight_h200s(), failures=failures))
    gpu = session.read().gpus[0]
    assert gpu.memory_reserved_bytes is None
    assert gpu.memory_used_bytes == 120 * GIB + H200_RESERVED  # v1 counts it as used
    assert gpu.processes == (GpuProcessMemory(4000, 120 * GIB),)


def test_mig_instances_replace_their_gpu(nvml: FakeNvml, session: NvmlSession) -> None:
    migs = (
        FakeMig(3, 1, "MIG-11111111-aaaa", total=70 * GIB, used=60 * GIB),
        FakeMig(3, 2, "MIG-22222222-bbbb", total=70 * GIB, used=10 * GIB),
    )
    processes = (FakeProcess("3", 1, 1), FakeProcess("3/2", 55, 10 * GIB))
    nvml.write(replace(eight_h200s().with_gpu(3, mig="1"), migs=migs, processes=processes))
    reading = session.read()
    assert indices(reading.gpus) == ["0", "1", "2", "3/1", "3/2", "4", "5", "6", "7"]
    instances = [gpu for gpu in reading.gpus if gpu.mig_mode]
    assert [gpu.uuid for gpu in instances] == ["MIG-11111111-aaaa", "MIG-22222222-bbbb"]
    assert [gpu.memory_used_bytes for gpu in instances] == [60 * GIB, 10 * GIB]
    assert instances[1].processes == (GpuProcessMemory(55, 10 * GIB),)
    assert instances[0].name == "NVIDIA H200 MIG 3g.71gb"
    assert instances[0].pci_bus_id == "00000000:5D:00.0"  # the parent's
    # The parent is not reported: its memory is counted once, through its instances.
    assert gpu_uuid(3) not in {gpu.uuid for gpu in reading.gpus}
    assert [gpu.visible_index for gpu in reading.gpus] == list(range(9))


def test_mig_enabled_without_instances_reports_nothing_for_the_gpu(
    nvml: FakeNvml, session: NvmlSession
) -> None:
    nvml.write(eight_h200s().with_gpu(0, mig="1").with_gpu(1, mig="na"))
    reading = session.read()
    assert indices(reading.gpus) == [str(i) for i in range(1, 8)]
    assert reading.failures == ()


def test_visible_devices_by_index_keep_their_order(nvml: FakeNvml) -> None:
    session = NvmlSession(("6", "2", "7"))
    reading = session.read()
    session.close()
    assert indices(reading.gpus) == ["6", "2", "7"]
    assert [gpu.visible_index for gpu in reading.gpus] == [0, 1, 2]


def test_visible_devices_by_uuid_and_prefix(nvml: FakeNvml) -> None:
    session = NvmlSession((gpu_uuid(5), "GPU-00000001", "GPU-00000003-1111"))
    reading = session.read()
    session.close()
    assert indices(reading.gpus) == ["5", "1", "3"]


def test_visible_mig_device_by_uuid(nvml: FakeNvml) -> None:
    migs = (FakeMig(2, 1, "MIG-aaaa"), FakeMig(2, 2, "MIG-bbbb"))
    nvml.write(replace(eight_h200s().with_gpu(2, mig="1"), migs=migs))
    session = NvmlSession(("MIG-bbbb", "0"))
    reading = session.read()
    session.close()
    assert indices(reading.gpus) == ["2/2", "0"]
    assert [gpu.visible_index for gpu in reading.gpus] == [0, 1]


def test_an_unknown_visible_device_ends_the_list_as_in_cuda(nvml: FakeNvml) -> None:
    session = NvmlSession(("1", "GPU-ffffffff", "2"))
    reading = session.read()
    session.close()
    assert indices(reading.gpus) == ["1"]
    assert reading.not_found == "GPU-ffffffff"
    session = NvmlSession(("0", "8"))  # 8 GPUs: indices 0..7
    reading = session.read()
    session.close()
    assert (indices(reading.gpus), reading.not_found) == (["0"], "8")


def test_a_gpu_named_twice_is_reported_once(nvml: FakeNvml) -> None:
    session = NvmlSession(("4", gpu_uuid(4), "5"))
    reading = session.read()
    session.close()
    assert indices(reading.gpus) == ["4", "5"]


def test_a_lost_gpu_is_left_out_and_the_others_keep_their_positions(
    nvml: FakeNvml, session: NvmlSession
) -> None:
    session.read()
    nvml.write(eight_h200s().with_gpu(2, error=GPU_IS_LOST))
    reading = session.read()
    assert indices(reading.gpus) == ["0", "1", "3", "4", "5", "6", "7"]
    assert [gpu.visible_index for gpu in reading.gpus] == [0, 1, 3, 4, 5, 6, 7]
    [failure] = reading.failures
    assert (failure.device, failure.reason) == ("2", "gpu_lost")
    assert "GPU is lost" in failure.message
    nvml.write(eight_h200s().with_gpu(2, error=UNKNOWN))
    assert session.read().failures[0].reason == "gpu_lost"
    nvml.write(eight_h200s())
    assert len(session.read().gpus) == 8


def test_a_lost_gpu_does_not_hide_the_one_a_uuid_names(nvml: FakeNvml) -> None:
    nvml.write(eight_h200s().with_gpu(0, error=GPU_IS_LOST))
    session = NvmlSession(("GPU-00000006", "GPU-00000000"))
    reading = session.read()
    session.close()
    assert indices(reading.gpus) == ["6"]
    assert [failure.device for failure in reading.failures] == ["GPU-00000000"]


def test_no_gpus(nvml: FakeNvml) -> None:
    nvml.write(FakeNvmlConfig())
    session = NvmlSession(None)
    reading = session.read()
    session.close()
    assert reading.gpus == ()
    assert reading.failures == ()
