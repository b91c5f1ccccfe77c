"""Compile fake_nvml.c with gcc against NVIDIA's nvml.h (PyPI nvidia-nvml-dev)."""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
# The soname the binding opens (pynvml: CDLL("libnvidia-ml.so.1")), so a directory holding
# the build can go first on LD_LIBRARY_PATH of a subprocess.
SONAME = "libnvidia-ml.so.1"


class BuildError(RuntimeError):
    """gcc or nvml.h is missing, or the compile failed."""


def nvml_header_dir() -> Path:
    """The include directory of nvidia-nvml-dev (nvidia/<cuda>/include/nvml.h)."""
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec else []
    headers = sorted(h for root in roots for h in Path(root).glob("*/include/nvml.h"))
    if not headers:
        raise BuildError("nvml.h not found: pip install nvidia-nvml-dev")
    return headers[-1].parent


def build_fake_nvml(directory: Path, gcc: str | None = None) -> Path:
    """Build (or reuse) the test library in `directory`; returns `directory`/SONAME."""
    compiler = gcc or shutil.which("gcc")
    if compiler is None:
        raise BuildError("gcc is not installed")
    include = nvml_header_dir()
    digest = hashlib.sha256(SOURCE.read_bytes() + (include / "nvml.h").read_bytes()).hexdigest()
    directory.mkdir(parents=True, exist_ok=True)
    library, stamp = directory / SONAME, directory / "fake_nvml.sha256"
    if library.exists() and stamp.exists() and stamp.read_text() == digest:
        return library
    command = [
        compiler,
        "-shared",
        "-fPIC",
        "-O2",
        "-std=c11",
        "-D_POSIX_C_SOURCE=200809L",
        "-Wall",
        "-Wextra",
        "-Werror",
        f"-I{include}",
        f"-Wl,-soname,{SONAME}",
        "-o",
        str(library),
        str(SOURCE),
    ]
    run = subprocess.run(command, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise BuildError(f"{' '.join(command)}\n{run.stderr}")
    stamp.write_text(digest)
    return library
