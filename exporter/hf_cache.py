"""Finding a Hugging Face model id in the local HF cache, offline, as huggingface_hub lays
it out:

    $HF_HUB_CACHE/models--google--gemma-3-27b-it/refs/main          -> a commit hash
    $HF_HUB_CACHE/models--google--gemma-3-27b-it/snapshots/<commit>/config.json

kvcap never downloads; a model that is not in the cache is an error saying how to get it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from exporter.bounded_files import read_regular_file
from exporter.errors import ConfigError

_COMMIT = re.compile(r"[0-9a-f]{40}")
# What the Hub accepts as a repository id: [namespace/]name.
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def hub_cache_dir(environ: Mapping[str, str]) -> Path:
    """The cache folder huggingface_hub uses with this environment."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if environ.get(name):
            return Path(environ[name]).expanduser()
    if environ.get("HF_HOME"):
        return Path(environ["HF_HOME"]).expanduser() / "hub"
    xdg = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME", "~"), ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def looks_like_repo_id(name: str) -> bool:
    return _REPO_ID.fullmatch(name) is not None and ".." not in name


def find_snapshot(repo_id: str, revision: str | None, environ: Mapping[str, str]) -> Path:
    """The snapshot folder of `repo_id` at `revision` (a branch, tag or commit; default
    main). Raises ConfigError saying where it looked."""
    cache = hub_cache_dir(environ)
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    wanted = revision or "main"
    if not repo.is_dir():
        raise ConfigError(
            f"model {repo_id}: not a local folder, and not in the Hugging Face cache {cache} "
            f"(kvcap does not download: `huggingface-cli download {repo_id} config.json`, "
            "or give the model's folder)"
        )
    commit = wanted if _COMMIT.fullmatch(wanted) else _read_ref(repo, wanted)
    if commit is None:
        snapshots = sorted(p.name for p in (repo / "snapshots").glob("*") if p.is_dir())
        if revision is None and len(snapshots) == 1:
            commit = snapshots[0]  # no refs/main (a download by commit): the only snapshot
        else:
            raise ConfigError(
                f"model {repo_id}: the Hugging Face cache {repo} has no revision {wanted} "
                f"(snapshots: {', '.join(snapshots) or 'none'}; give --revision)"
            )
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        raise ConfigError(f"model {repo_id}: {snapshot} is missing from the Hugging Face cache")
    return snapshot


# A ref file holds one commit hash (40 characters and maybe a newline).
MAX_REF_BYTES = 256


def _read_ref(repo: Path, revision: str) -> str | None:
    """The commit a branch or tag names; None for a ref that is missing, or that is not a
    small regular file (the cache may be a volume vLLM's side writes to)."""
    try:
        data = read_regular_file(repo / "refs" / revision, max_bytes=MAX_REF_BYTES)
        text = data.decode("utf-8").strip()
    except (OSError, ValueError, ConfigError):  # FileRefused is a ConfigError
        return None
    return text if _COMMIT.fullmatch(text) else None
