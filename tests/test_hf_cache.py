"""A Hugging Face model id resolves to its config.json in the local HF cache, offline, laid
out as huggingface_hub lays it out (and checked against huggingface_hub's own reader)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir, try_to_load_from_cache

from exporter.errors import ConfigError
from exporter.hf_cache import hub_cache_dir
from exporter.model_config import resolve_model
from tests.conftest import GOLDEN
from tests.support import cli_command

LLAMA_CONFIG = (GOLDEN / "handshake" / "configs" / "llama-3.1-8b" / "config.json").read_bytes()
REPO = "meta-llama/Llama-3.1-8B-Instruct"
MAIN = "0e9e39f249a16976918f6564b8830bc894c89659"
DEV = "5206a32e0bd3067aef1ce90f5528ade7d866253f"


def add_snapshot(cache: Path, repo_id: str, commit: str, files: dict[str, bytes]) -> Path:
    """What hf_hub_download leaves behind: content-addressed blobs, a snapshot folder of
    relative symlinks to them, and refs/<branch> holding the commit."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for name, content in files.items():
        blob = repo / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


def set_ref(cache: Path, repo_id: str, branch: str, commit: str) -> None:
    ref = cache / ("models--" + repo_id.replace("/", "--")) / "refs" / branch
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)  # no newline, as huggingface_hub writes it


@pytest.fixture
def hub(tmp_path: Path) -> Path:
    cache = tmp_path / "hf-home" / "hub"
    add_snapshot(cache, REPO, MAIN, {"config.json": LLAMA_CONFIG})
    set_ref(cache, REPO, "main", MAIN)
    dev_config = json.loads(LLAMA_CONFIG) | {"max_position_embeddings": 8192}
    add_snapshot(cache, REPO, DEV, {"config.json": json.dumps(dev_config).encode()})
    set_ref(cache, REPO, "dev", DEV)
    return cache


def test_the_layout_is_what_huggingface_hub_reads(hub: Path) -> None:
    expected = try_to_load_from_cache(REPO, "config.json", cache_dir=hub)
    assert isinstance(expected, str)
    resolved = resolve_model(REPO, environ={"HF_HUB_CACHE": str(hub)})
    assert resolved.config_file == Path(expected)
    assert resolved.found_in == "Hugging Face cache"
    dev = try_to_load_from_cache(REPO, "config.json", cache_dir=hub, revision="dev")
    assert resolve_model(REPO, revision="dev", environ={"HF_HUB_CACHE": str(hub)}).config_file == (
        Path(str(dev))
    )
    assert [repo.repo_id for repo in scan_cache_dir(hub).repos] == [REPO]


def test_cache_folder_follows_huggingface_hubs_variables(tmp_path: Path) -> None:
    assert hub_cache_dir({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == Path("/a")
    assert hub_cache_dir({"HF_HOME": "/b"}) == Path("/b/hub")
    assert hub_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/huggingface/hub")
    assert hub_cache_dir({"HOME": "/home/u"}) == Path("/home/u/.cache/huggingface/hub")


def test_a_commit_revision_and_a_lone_snapshot(hub: Path, tmp_path: Path) -> None:
    environ = {"HF_HUB_CACHE": str(hub)}
    assert resolve_model(REPO, revision=DEV, environ=environ).folder.name == DEV
    # Downloaded by commit only: no refs/main, one snapshot.
    add_snapshot(hub, "org/only", MAIN, {"config.json": LLAMA_CONFIG})
    assert resolve_model("org/only", environ=environ).folder.name == MAIN
    with pytest.raises(ConfigError, match="has no revision v2"):
        resolve_model(REPO, revision="v2", environ=environ)
    with pytest.raises(ConfigError, match="kvcap does not download"):
        resolve_model("google/not-here", environ=environ)


def capacity(hub_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_command("capacity", "--json", *args),
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **hub_env},
    )


@pytest.mark.process
@pytest.mark.parametrize("variable", ["HF_HOME", "HF_HUB_CACHE"])
def test_capacity_takes_a_hugging_face_id(hub: Path, variable: str) -> None:
    where = str(hub.parent) if variable == "HF_HOME" else str(hub)
    env = {variable: where}
    env.pop("HF_HUB_CACHE" if variable == "HF_HOME" else "HF_HOME", None)
    run = capacity(env, "--", "vllm", "serve", REPO, "--kv-cache-memory-bytes", "20GiB")
    assert run.returncode == 0, run.stderr
    document = json.loads(run.stdout)
    assert document["used"]["found_in"] == "Hugging Face cache"
    assert document["used"]["config_file"].endswith(f"snapshots/{MAIN}/config.json")
    assert document["result"]["max_model_len"] == 131072
    dev = capacity(env, REPO, "--revision", "dev", "--kv-cache-memory-bytes", "20GiB")
    assert json.loads(dev.stdout)["result"]["max_model_len"] == 8192


@pytest.mark.process
def test_a_model_not_in_the_cache_is_one_line_saying_where_it_looked(hub: Path) -> None:
    run = subprocess.run(
        cli_command("capacity", "google/gemma-3-27b-it",
            "--kv-cache-memory-bytes", "20GiB"),
        capture_output=True, text=True, check=False,
        env={**os.environ, "HF_HUB_CACHE": str(hub)},
    )  # fmt: skip
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1
    assert f"not in the Hugging Face cache {hub}" in run.stderr


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_ref_that_is_no_small_regular_file_is_no_ref_and_never_waited_on(
    tmp_path: Path, kind: str
) -> None:
    """The cache may be a volume vLLM's side writes to: refs/main a FIFO (open() would wait
    for a writer for good), a device or a huge file names no commit."""
    cache = tmp_path / "hub"
    add_snapshot(cache, REPO, MAIN, {"config.json": LLAMA_CONFIG})
    ref = cache / ("models--" + REPO.replace("/", "--")) / "refs" / "main"
    ref.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(ref)
    elif kind == "device":
        ref.symlink_to("/dev/zero")
    else:
        ref.write_text(MAIN + " " * 2**20)
    # No ref: the only snapshot is taken, as for a download by commit. On a thread, so
    # that a read that waits on the FIFO fails the test instead of hanging it.
    found: list[Path] = []
    reader = threading.Thread(
        target=lambda: found.append(
            resolve_model(REPO, environ={"HF_HUB_CACHE": str(cache)}).folder
        ),
        daemon=True,
    )
    reader.start()
    reader.join(10)
    assert [folder.name for folder in found] == [MAIN]
    add_snapshot(cache, REPO, DEV, {"config.json": LLAMA_CONFIG})  # two: which is main?
    with pytest.raises(ConfigError, match="has no revision main"):
        resolve_model(REPO, environ={"HF_HUB_CACHE": str(cache)})
