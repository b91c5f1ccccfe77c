"""Finding and reading a model's config.json on disk (the capacity model does no I/O)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.bounded_files import (
    MAX_MODEL_CONFIG_BYTES,
    FileRefused,
    read_regular_file,
    stat_within,
)
from exporter.errors import ConfigError
from exporter.hf_cache import find_snapshot, looks_like_repo_id
from exporter.json_documents import NotJson, read_json


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
        return _version(file.stat())
    except (OSError, ValueError):  # ValueError: a path with a NUL byte
        return None


def file_version_within(folder: Path, path: str, *, as_root: bool) -> FileVersion | None:
    """file_version of `path` resolved inside `folder` (bounded_files.stat_within): another
    process's file, through /proc/<pid>/root or cwd."""
    try:
        return _version(stat_within(folder, path, as_root=as_root))
    except (OSError, ValueError):
        return None


def _version(stat: os.stat_result) -> FileVersion:
    return FileVersion(stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def load_model_config(path: Path) -> dict[str, Any]:
    """Read config.json from a file or a model directory, within the bounds of
    bounded_files (a regular file of at most MAX_MODEL_CONFIG_BYTES) and read_json."""
    file = model_config_file(path)
    try:
        data = read_json(read_regular_file(file, max_bytes=MAX_MODEL_CONFIG_BYTES))
    except FileRefused as error:
        raise error.naming(str(file)) from None
    except OSError as error:
        raise ConfigError(f"cannot read {file}: {error.strerror or error}") from None
    except NotJson as error:  # before ValueError, which it is
        raise FileRefused("file_malformed", f"{file} is not valid JSON: {error}") from None
    except ValueError as error:  # a NUL byte in the path
        raise ConfigError(f"cannot read {file}: {error}") from None
    if not isinstance(data, dict):
        raise FileRefused("file_malformed", f"{file} must hold a JSON object")
    return data


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """Where a model name led: its config.json, the folder around it, and how it was found."""

    name: str
    config_file: Path
    folder: Path
    found_in: str  # "folder", "file" or "Hugging Face cache"


def resolve_model(
    name: str, *, revision: str | None = None, environ: Mapping[str, str] | None = None
) -> ResolvedModel:
    """A model folder, a config.json, or a Hugging Face id found in the local HF cache."""
    path = Path(name).expanduser()
    if path.is_dir():
        return ResolvedModel(name, path / "config.json", path, "folder")
    if path.is_file():
        return ResolvedModel(name, path, path.parent, "file")
    if name.startswith(("/", ".", "~")) or not looks_like_repo_id(name):
        raise ConfigError(f"model {name}: no such file or folder")
    snapshot = find_snapshot(name, revision, os.environ if environ is None else environ)
    return ResolvedModel(name, snapshot / "config.json", snapshot, "Hugging Face cache")
