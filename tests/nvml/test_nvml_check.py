"""`kvcap-exporter nvml-check` (and scripts/nvml-check.py, which runs it from a checkout)
finds the test library the way it would find the driver's (LD_LIBRARY_PATH), beside a
stand-in nvidia-smi that prints the same GPUs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import cli_command
from tools.nvml.fake import FakeNvml, FakeNvmlConfig, eight_h200s

pytest_plugins = ["tests.nvml.fixtures"]

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "nvml-check.py"
MIB = 2**20


def smi_rows(config: FakeNvmlConfig) -> str:
    return "".join(
        f"{gpu.index}, {gpu.uuid}, {gpu.name}, {gpu.pci_bus_id}, {config.driver}, "
        f"{gpu.total // MIB}, {gpu.used // MIB}, {gpu.free // MIB}, {gpu.reserved // MIB}\n"
        for gpu in config.gpus
    )


def run_check(
    fake: FakeNvml, tmp_path: Path, smi_output: str | None, *, script: bool = False
) -> tuple[int, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi_output is not None:
        (tmp_path / "smi.csv").write_text(smi_output)
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\ncat {tmp_path / 'smi.csv'}\n")
        smi.chmod(0o755)
    env = {**os.environ, **fake.environment(), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--rounds", "3"]
        if script
        else cli_command("nvml-check", "--rounds", "3"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,  # standalone: not from the repository root
    )
    return run.returncode, run.stdout + run.stderr


@pytest.mark.parametrize("script", [False, True], ids=["command", "script"])
def test_matching_figures(fake_nvml: FakeNvml, tmp_path: Path, script: bool) -> None:
    config = eight_h200s()
    fake_nvml.write(config)
    status, output = run_check(fake_nvml, tmp_path, smi_rows(config), script=script)
    assert status == 0, output
    assert "all figures agree" in output
    assert output.count("DIFFERENT") == 0
    assert "collector read of 8 devices" in output


def test_a_different_figure_is_reported(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    config = eight_h200s()
    fake_nvml.write(config)
    rows = smi_rows(config).replace("NVIDIA H200", "NVIDIA H100", 1)
    status, output = run_check(fake_nvml, tmp_path, rows)
    assert status == 1, output
    assert output.count("DIFFERENT") == 1


@pytest.mark.parametrize("smi", [None, "rows"])
def test_without_nvidia_smi_or_nvml(fake_nvml: FakeNvml, tmp_path: Path, smi: str | None) -> None:
    if smi is None:
        fake_nvml.write(eight_h200s())
    else:
        fake_nvml.config_path.unlink()  # no driver
    status, output = run_check(fake_nvml, tmp_path, None if smi is None else "")
    assert status == 2, output
    if smi is not None:
        assert "NVML is not available: Driver Not Loaded" in output


@pytest.mark.parametrize("rounds", ["0", "100001", "many"])
def test_rounds_out_of_bounds_is_a_usage_error_in_one_line(rounds: str) -> None:
    run = subprocess.run(
        cli_command("nvml-check", "--rounds", rounds),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1
    assert "--rounds" in run.stderr
