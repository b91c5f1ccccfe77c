"""`kvcap-exporter` as a user runs it: the argv of a fresh interpreter of this checkout."""

from __future__ import annotations

import sys


def cli_command(*args: str) -> list[str]:
    """The argv that runs `kvcap-exporter ARGS` from this checkout's interpreter."""
    return [sys.executable, "-m", "exporter.cli", *args]
