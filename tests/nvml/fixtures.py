"""pytest fixtures for the test NVML library; test modules load them with
`pytest_plugins = ["tests.nvml.fixtures"]`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pynvml  # type: ignore[import-untyped]
import pytest

from exporter.collectors import load_library
from tests.tools import require_tool
from tools.nvml.build import build_fake_nvml
from tools.nvml.fake import FakeNvml, FakeNvmlConfig


@pytest.fixture(scope="session")
def fake_nvml_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """fake_nvml.c built once per test session, as libnvidia-ml.so.1 in a temp folder."""
    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"), gcc=require_tool("gcc"))


@pytest.fixture
def fake_nvml(
    fake_nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeNvml]:
    """The test library loaded into nvidia-ml-py (pynvml.nvmlLib), with an empty config
    the test rewrites; every nvmlInit must be shut down by the end of the test."""
    fake = FakeNvml(fake_nvml_library, tmp_path / "nvml.conf")
    fake.write(FakeNvmlConfig())
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(fake.config_path))
    previous = pynvml.nvmlLib
    load_library(str(fake_nvml_library))
    before = fake.init_refcount()
    yield fake
    with pynvml.libLoadLock:  # later tests get the binding as they would have found it
        pynvml.nvmlLib = previous
        pynvml._nvmlGetFunctionPointer_cache.clear()
    assert fake.init_refcount() == before, "an nvmlInit without nvmlShutdown"
