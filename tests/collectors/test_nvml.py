"""Collector `nvml` against a StateStore: no driver, lost GPUs, re-initialisation, its thread."""

from __future__ import annotations

import argparse
import ctypes.util
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import structlog

from exporter.collectors import COLLECTORS, NvmlCollector, NvmlPoller, NvmlSession, NvmlSettings
from exporter.flags import Flags
from exporter.state import Snapshot, StateStore
from tests.support import wait_for
from tools.nvml.fake import (
    DRIVER_NOT_LOADED,
    GIB,
    GPU_IS_LOST,
    FakeMig,
    FakeNvml,
    FakeNvmlConfig,
    eight_h200s,
    gpu_uuid,
)

pytest_plugins = ["tests.nvml.fixtures"]

NO_DRIVER = "nvml_no_driver"


class Harness:
    """A poller on a private store, driven one poll at a time."""

    def __init__(self, fake: FakeNvml, **settings: Any) -> None:
        self.fake = fake
        self.store = StateStore()
        settings.setdefault("library_path", str(fake.library))
        self.poller = NvmlPoller(NvmlSettings(**settings), self.store, threading.Event())

    def poll(self) -> float:
        return self.poller.poll_once()

    @property
    def snapshot(self) -> Snapshot:
        return self.store.snapshot()

    def errors(self, reason: str) -> int:
        return self.snapshot.errors.get(("nvml", reason), 0)

    def up(self) -> bool:
        [status] = [s for s in self.snapshot.collectors if s.collector == "nvml"]
        return status.up


@pytest.fixture
def harness(fake_nvml: FakeNvml) -> Any:
    fake_nvml.write(eight_h200s())
    made = Harness(fake_nvml, poll_interval_s=5.0)
    yield made
    made.poller.close()


def test_eight_gpus_are_published_in_order(harness: Harness) -> None:
    assert harness.poll() == 5.0
    assert [gpu.uuid for gpu in harness.snapshot.gpus] == [gpu_uuid(i) for i in range(8)]
    [status] = harness.snapshot.collectors
    assert (status.collector, status.target, status.up) == ("nvml", "local", True)
    assert status.last_duration_s is not None


def test_visible_devices_order_is_the_published_order(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(eight_h200s())
    harness = Harness(fake_nvml, visible_devices=("7", gpu_uuid(0), "GPU-00000004"))
    harness.poll()
    harness.poller.close()
    assert [gpu.index for gpu in harness.snapshot.gpus] == ["7", "0", "4"]


def test_a_lost_gpu_is_dropped_counted_and_recovered(harness: Harness) -> None:
    harness.poll()
    harness.fake.write(eight_h200s().with_gpu(5, error=GPU_IS_LOST))
    with structlog.testing.capture_logs() as logs:
        assert harness.poll() == 5.0  # the other GPUs keep the poll interval
        harness.poll()
    assert [gpu.index for gpu in harness.snapshot.gpus] == ["0", "1", "2", "3", "4", "6", "7"]
    assert harness.errors("gpu_lost") == 2
    assert harness.up()
    assert [entry["event"] for entry in logs].count("gpu_failed") == 1
    # NVML was re-initialised once, right after the loss; the next waits for its backoff.
    assert harness.poller.reopen_failures == 1
    harness.fake.write(eight_h200s().with_gpu(5, used=1 * GIB))
    with structlog.testing.capture_logs() as logs:
        harness.poll()
    assert len(harness.snapshot.gpus) == 8
    assert harness.snapshot.gpus[5].memory_used_bytes == GIB
    assert harness.poller.reopen_failures == 0
    assert [entry["event"] for entry in logs] == ["gpu_recovered"]


def test_reinitialisation_backs_off_exponentially(harness: Harness) -> None:
    harness.poll()
    harness.fake.write(eight_h200s().with_gpu(1, error=GPU_IS_LOST))
    inits = []
    for _ in range(4):
        before = harness.fake.call_count()
        harness.poll()
        harness.poller.reopen_at = 0.0  # as if the backoff had passed
        inits.append(harness.fake.call_count() - before)
    assert harness.poller.reopen_failures == 4
    assert harness.fake.init_refcount() == 1  # every re-init shut the old session down
    delays = [harness.poller._backoff_s(n) for n in (1, 2, 3, 4, 10)]
    assert 2.5 <= delays[0] <= 5.0
    assert 20.0 <= delays[3] <= 40.0
    assert delays[4] <= 300.0  # the cap


def test_all_gpus_failing_is_a_failed_read(harness: Harness) -> None:
    harness.poll()
    config = eight_h200s()
    for index in range(8):
        config = config.with_gpu(index, error=GPU_IS_LOST)
    harness.fake.write(config)
    harness.poll()
    assert not harness.up()
    assert harness.errors("gpu_lost") == 1
    [status] = harness.snapshot.collectors
    assert status.last_error is not None
    assert "GPU 0: " in status.last_error
    harness.fake.write(eight_h200s())
    harness.poller.reopen_at = 0.0
    harness.poll()
    assert harness.up()


def test_the_driver_going_away_after_start_is_a_failure(harness: Harness) -> None:
    harness.poll()
    lost = eight_h200s().with_gpu(0, error=GPU_IS_LOST)
    harness.fake.write(replace(lost, init_error=DRIVER_NOT_LOADED))
    harness.poll()  # GPU 0 fails, then re-init fails: the whole source is down
    assert not harness.up()
    assert harness.poller.session is None
    assert harness.errors("gpu_lost") == 2  # the lost GPU, and the failed re-init
    harness.fake.write(eight_h200s())
    harness.poll()
    assert harness.up()
    assert len(harness.snapshot.gpus) == 8


def test_driver_not_loaded_is_no_data(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(FakeNvmlConfig(init_error=DRIVER_NOT_LOADED))
    harness = Harness(fake_nvml, poll_interval_s=2.0)
    with structlog.testing.capture_logs() as logs:
        delays = [harness.poll() for _ in range(5)]
    assert [entry["event"] for entry in logs] == [NO_DRIVER]
    assert "Driver Not Loaded" in logs[0]["error"]
    assert harness.snapshot.collectors == ()  # no target: readiness does not wait for NVML
    assert harness.snapshot.gpus == ()
    assert harness.snapshot.errors == {}
    assert 1.0 <= delays[0] <= 2.0
    assert 16.0 <= delays[4] <= 32.0
    # The driver is loaded later: the source starts reporting.
    fake_nvml.write(eight_h200s())
    harness.poll()
    harness.poller.close()
    assert len(harness.snapshot.gpus) == 8
    assert harness.up()


def test_no_library_is_no_data(tmp_path: Path) -> None:
    store = StateStore()
    settings = NvmlSettings(poll_interval_s=0.01, library_path=str(tmp_path / "missing.so"))
    source = NvmlCollector(settings)
    with structlog.testing.capture_logs() as logs:
        source.start(store)
        time.sleep(0.2)  # several retries
        source.stop(1.0)
    assert [entry["event"] for entry in logs] == [NO_DRIVER]
    assert store.snapshot().collectors == ()
    assert store.snapshot().gpus == ()


@pytest.mark.process
def test_the_loaders_own_search() -> None:
    """The default: nvidia-ml-py's own search for libnvidia-ml.so.1, in a fresh process
    where no test has handed the binding a library. Without a driver the collector reports
    nothing and registers no target; with one, it registers its target."""
    code = (
        "import threading; from exporter.collectors.nvml import NvmlPoller, NvmlSettings; "
        "from exporter.state import StateStore; store = StateStore(); "
        "poller = NvmlPoller(NvmlSettings(), store, threading.Event()); "
        "poller.poll_once(); poller.poll_once(); "
        "print(len(store.snapshot().collectors), len(store.snapshot().gpus))"
    )
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    run = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    output = run.stdout.splitlines()  # structlog's default logger prints to stdout
    driver = ctypes.util.find_library("nvidia-ml") is not None
    targets, _ = output[-1].split()
    assert targets == ("1" if driver else "0")
    if not driver:
        assert output[-1] == "0 0"
    assert sum(NO_DRIVER in line for line in output) == 1


def test_mig_on_one_gpu(harness: Harness) -> None:
    migs = (FakeMig(6, 1, "MIG-one"), FakeMig(6, 2, "MIG-two"), FakeMig(6, 3, "MIG-three"))
    harness.fake.write(replace(eight_h200s().with_gpu(6, mig="1"), migs=migs))
    harness.poll()
    gpus = harness.snapshot.gpus
    assert [gpu.index for gpu in gpus][6:] == ["6/1", "6/2", "6/3", "7"]
    assert len({gpu.uuid for gpu in gpus}) == len(gpus) == 10
    assert gpu_uuid(6) not in {gpu.uuid for gpu in gpus}


def test_the_source_thread_follows_the_config_while_it_runs(fake_nvml: FakeNvml) -> None:
    fake_nvml.write(eight_h200s())
    store = StateStore()
    source = NvmlCollector(NvmlSettings(poll_interval_s=0.01, library_path=str(fake_nvml.library)))
    source.start(store)
    try:
        wait_for(lambda: len(store.snapshot().gpus) == 8, 5.0, "8 GPUs")
        fake_nvml.write(eight_h200s().with_gpu(0, used=7 * GIB))
        wait_for(
            lambda: store.snapshot().gpus[0].memory_used_bytes == 7 * GIB, 5.0, "GPU 0 at 7 GiB"
        )
        fake_nvml.write(eight_h200s().with_gpu(3, error=GPU_IS_LOST))
        wait_for(lambda: len(store.snapshot().gpus) == 7, 5.0, "7 GPUs")
        assert store.snapshot().errors[("nvml", "gpu_lost")] >= 1
        fake_nvml.write(eight_h200s())
        wait_for(lambda: len(store.snapshot().gpus) == 8, 5.0, "8 GPUs")
    finally:
        began = time.monotonic()
        source.stop(2.0)
        stopped_in = time.monotonic() - began
    assert stopped_in < 0.5
    assert source._thread is not None
    assert not source._thread.is_alive()
    assert fake_nvml.init_refcount() == 0  # the thread shut NVML down on its way out


def build(argv: list[str]) -> NvmlCollector:
    parser = argparse.ArgumentParser()
    COLLECTORS["nvml"].add_arguments(Flags(parser).group("nvml"))
    source = COLLECTORS["nvml"].build(parser.parse_args(argv))
    assert isinstance(source, NvmlCollector)
    return source


def test_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    assert COLLECTORS["nvml"].default_enabled
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert build([]).settings == NvmlSettings()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert build([]).settings.visible_devices == ("2", "3")
    settings = build(
        ["--nvml.visible-devices", "GPU-abc,1", "--nvml.poll-interval", "1.5"]
    ).settings
    assert settings.visible_devices == ("GPU-abc", "1")
    assert settings.poll_interval_s == 1.5
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert build([]).settings.visible_devices == ()  # CUDA sees no GPU; neither do we


def test_an_unexpected_error_is_a_failed_read_not_a_dead_thread(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.poll()

    def broken(self: NvmlSession) -> None:
        raise RuntimeError("a bug")

    with monkeypatch.context() as patch:
        patch.setattr(NvmlSession, "read", broken)
        with structlog.testing.capture_logs() as logs:
            delay = harness.poller.poll_safely()
    assert 2.5 <= delay <= 5.0
    assert [entry["event"] for entry in logs][:1] == ["nvml_poll_failed"]
    assert harness.errors("internal") == 1
    assert harness.poller.session is None  # shut down; the next poll starts afresh
    harness.poller.poll_safely()
    assert harness.up()
