"""Reading a model's config.json from disk (the capacity model itself does no I/O)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from exporter.errors import ConfigError


@dataclass(frozen=True, slots=True)
class FileVersion:
    """What os.stat says of a file: it changes when the file is rewritten, replaced (a new
    inode, as an atomic rename or a Kubernetes volume's symlink swap makes) or chmod-ed."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def model_config_file(path: Path) -> Path:
    """The config.json that `path` names: the file itself, or the one in a model directory."""
    return path / "config.json" if path.is_dir() else path


def file_version(file: Path) -> FileVersion | None:
    """The version of `file` now (following symlinks), or None when it cannot be stat-ed."""
    try:
        stat = file.stat()
    except (OSError, ValueError):  # ValueError: a path with a NUL byte
        return None
    return FileVersion(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def load_model_config(path: Path) -> dict[str, Any]:
    """Read config.json from a file or a model directory."""
    file = model_config_file(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except OSError as error:
        raise ConfigError(f"cannot read {file}: {error.strerror or error}") from None
    except (ValueError, RecursionError) as error:
        # ValueError: not JSON, not UTF-8, or an integer of over 4,300 digits;
        # RecursionError: nesting deeper than Python's json follows.
        raise ConfigError(f"{file} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file} must hold a JSON object")
    try:
        # Python's json turns an escaped lone surrogate ("\\ud800") into a str no UTF-8
        # writer accepts; kvcap's outputs are UTF-8, so such a file is refused here.
        msgspec.json.encode(data)
    except UnicodeEncodeError:
        raise ConfigError(f"{file} holds a string with a lone UTF-16 surrogate") from None
    return data
