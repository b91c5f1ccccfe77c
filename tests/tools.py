"""Finding the external tools tests use; CI=true turns a missing tool into a failure."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import NoReturn

import pytest


def missing(what: str) -> NoReturn:
    """Something a test needs is not here: a failure under CI=true, else a skip."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what}; CI must provide it")
    pytest.skip(what)


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
