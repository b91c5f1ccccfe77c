"""Finding the external tools tests use; CI=true turns a missing tool into a failure."""

from __future__ import annotations

import os
import shutil

import pytest


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{name} is not installed; CI must install it (Debian package)")
        pytest.skip(f"{name} is not installed (make test installs it when run as root)")
    return path
