"""The sidecar reads what it is told as vLLM would: `--config FILE.yaml` inside --vllm.args
(and in a /proc command line), a Hugging Face id found in the HF cache."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from pathlib import Path

import pytest
import structlog.testing

from exporter.bounded_files import read_vllm_config_within
from exporter.cli import CommandLineParser
from exporter.collectors import (
    ServerPoller,
    VllmHttpSettings,
    discover_serve_args,
    fetch,
    vllm_http,
    vllm_http_settings,
    vllm_processes,
)
from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.demo import simulated_deployment
from exporter.demo.simulated_vllm import SimulatedVllm
from exporter.errors import ConfigError
from exporter.flags import Flags
from exporter.state import EngineView, StateStore
from tests.test_bounded_files import BILLION_LAUGHS
from tests.test_hf_cache import add_snapshot, set_ref

COMMIT = "0e9e39f249a16976918f6564b8830bc894c89659"


def built(*flags: str) -> VllmHttpSettings:
    parser = CommandLineParser()
    vllm_http_settings.add_arguments(Flags(parser).group("vllm_http"))
    collector = vllm_http._build(parser.parse_args(["--vllm.url=http://127.0.0.1:1", *flags]))
    assert collector is not None
    return collector.settings


def test_vllm_args_read_the_config_file_as_vllm_does(tmp_path: Path) -> None:
    config = tmp_path / "vllm.yaml"
    config.write_text("tensor_parallel_size: 2\ndata_parallel_size: 2\nmax_model_len: 131072\n")
    told = built("--vllm.args", f"/models/gemma --config {config} -tp 4").serve_args
    assert told is not None
    assert (told.tensor_parallel_size, told.data_parallel_size) == (4, 2)
    assert told.max_model_len == 131072
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match=f"--config {missing}: cannot read it"):
        built("--vllm.args", f"/models/gemma --config {missing}")


def test_a_proc_command_line_reads_its_config_file_from_the_process_root(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    entry = proc / "4242"
    (entry / "root" / "etc").mkdir(parents=True)
    (entry / "root" / "etc" / "vllm.yaml").write_text("max-model-len: 8192\n")
    argv = ["vllm", "serve", "/models/x", "--config", "/etc/vllm.yaml"]
    (entry / "cmdline").write_bytes(b"\0".join(w.encode() for w in argv) + b"\0")
    found = discover_serve_args(proc)
    assert found is not None
    assert (found.model, found.max_model_len) == ("/models/x", 8192)
    (entry / "root" / "etc" / "vllm.yaml").unlink()  # not readable from here: flags alone
    alone = discover_serve_args(proc)
    assert alone is not None
    assert (alone.model, alone.max_model_len) == ("/models/x", None)


def test_a_config_link_in_the_process_root_resolves_inside_that_root(tmp_path: Path) -> None:
    """The process's own links, absolute ones and `..` included, are followed as it would
    follow them, inside its root: never to kvcap's own files (followed plainly through
    /proc/<pid>/root, `/etc/vllm.yaml -> /secret.yaml` read the sidecar's /secret.yaml)."""
    proc = tmp_path / "proc"
    entry = proc / "4242"
    root = entry / "root"
    (root / "etc" / "configmap" / "..data").mkdir(parents=True)
    # A Kubernetes ConfigMap mount: relative links into a timestamped folder.
    (root / "etc" / "configmap" / "..data" / "vllm.yaml").write_text("max-model-len: 8192\n")
    (root / "etc" / "configmap" / "vllm.yaml").symlink_to("..data/vllm.yaml")
    (root / "etc" / "vllm.yaml").symlink_to("/etc/configmap/vllm.yaml")  # absolute, in-root
    outside = tmp_path / "secret.yaml"  # the sidecar's own file, not the process's
    outside.write_text("max-model-len: 1234\n")
    (root / "etc" / "escape.yaml").symlink_to(str(outside))
    (root / "etc" / "climb.yaml").symlink_to("../../../../secret.yaml")
    (entry / "cwd").mkdir()
    (entry / "cwd" / "up.yaml").symlink_to("../root/etc/configmap/..data/vllm.yaml")

    def told(config: str) -> int | None:
        argv = ["vllm", "serve", "/models/x", "--config", config]
        (entry / "cmdline").write_bytes(b"\0".join(w.encode() for w in argv) + b"\0")
        found = discover_serve_args(proc, command_lines=vllm_processes.CommandLines())
        assert found is not None
        return found.max_model_len

    assert told("/etc/vllm.yaml") == 8192
    assert told("/etc/escape.yaml") is None  # /tmp/.../secret.yaml inside the root: none
    assert told("/etc/climb.yaml") is None  # `..` stops at the root: /secret.yaml, none
    assert told("up.yaml") is None  # beneath the working folder only: refused (EXDEV)


def test_a_config_link_in_the_process_root_is_read_again_when_its_target_changes(
    tmp_path: Path,
) -> None:
    """The version that keeps a parsed --config is the version of the file read, resolved
    inside the process's root too: stat-ed plainly through /proc/<pid>/root, an absolute
    link (a ConfigMap's `/etc/vllm.yaml -> /etc/configmap/vllm.yaml`) was the sidecar's own
    path, missing or unchanged, and a changed config was never read again."""
    proc = tmp_path / "proc"
    entry = proc / "4242"
    root = entry / "root"
    (root / "etc" / "configmap").mkdir(parents=True)
    target = root / "etc" / "configmap" / "vllm.yaml"
    target.write_text("max-model-len: 8192\n")
    (root / "etc" / "vllm.yaml").symlink_to("/etc/configmap/vllm.yaml")  # absolute, in-root
    argv = ["vllm", "serve", "/models/x", "--config", "/etc/vllm.yaml"]
    (entry / "cmdline").write_bytes(b"\0".join(w.encode() for w in argv) + b"\0")
    command_lines = vllm_processes.CommandLines()

    def told() -> int | None:
        found = discover_serve_args(proc, command_lines=command_lines)
        assert found is not None
        return found.max_model_len

    assert told() == 8192
    target.write_text("max-model-len: 131072\n")
    assert told() == 131072


def test_a_config_file_is_read_once_per_change_not_once_a_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc = tmp_path / "proc"
    entry = proc / "4242"
    (entry / "root" / "etc").mkdir(parents=True)
    config = entry / "root" / "etc" / "vllm.yaml"
    config.write_text("max-model-len: 8192\n")
    argv = ["vllm", "serve", "/models/x", "--config", "/etc/vllm.yaml"]
    (entry / "cmdline").write_bytes(b"\0".join(w.encode() for w in argv) + b"\0")
    reads: list[str] = []

    def counted(folder: Path, path: str, *, as_root: bool) -> str:
        reads.append(path)
        return read_vllm_config_within(folder, path, as_root=as_root)

    monkeypatch.setattr(vllm_processes, "read_vllm_config_within", counted)
    command_lines = vllm_processes.CommandLines()
    lengths = [
        getattr(discover_serve_args(proc, command_lines=command_lines), "max_model_len", None)
        for _ in range(5)
    ]
    assert (lengths, len(reads)) == ([8192] * 5, 1)
    replacement = config.with_name("vllm.yaml.new")
    replacement.write_text("max-model-len: 4096\n")
    replacement.rename(config)  # a new inode: a new version
    found = discover_serve_args(proc, command_lines=command_lines)
    assert (getattr(found, "max_model_len", None), len(reads)) == (4096, 2)
    # Another process (or the same PID with a new command line) is parsed afresh.
    (entry / "cmdline").write_bytes(b"\0".join(w.encode() for w in [*argv, "-tp", "2"]) + b"\0")
    found = discover_serve_args(proc, command_lines=command_lines)
    assert (getattr(found, "tensor_parallel_size", None), len(reads)) == (2, 3)
    assert command_lines.refused == []


@pytest.mark.parametrize(
    ("kind", "reason", "why"),
    [
        ("fifo", "file_not_regular", "a FIFO, not a regular file (kvcap reads only those)"),
        ("bad-value", "file_malformed", "--max-model-len: not a count: 'banana'"),
    ],
)
def test_a_config_file_past_its_bounds_marks_the_settings_refused_once(
    tmp_path: Path, kind: str, reason: str, why: str
) -> None:
    proc = tmp_path / "proc"
    entry = proc / "4242"
    (entry / "root" / "etc").mkdir(parents=True)
    config = entry / "root" / "etc" / "vllm.yaml"
    if kind == "fifo":
        os.mkfifo(config)  # no writer ever comes
    else:
        config.write_text("max_model_len: banana\n")
    argv = ["vllm", "serve", "/models/x", "--config", "/etc/vllm.yaml", "-tp", "2"]
    (entry / "cmdline").write_bytes(b"\0".join(w.encode() for w in argv) + b"\0")
    command_lines = vllm_processes.CommandLines()
    refused = []
    for _ in range(3):
        found = discover_serve_args(proc, command_lines=command_lines)
        assert found is not None
        assert found.tensor_parallel_size == 2  # the command line is still known
        refused.append(found.config_refused or "")
    assert refused[0].startswith(f"--config /etc/vllm.yaml: {why}")
    assert refused == [refused[0]] * 3
    assert [(r.reason, str(r)) for r in command_lines.refused] == [(reason, refused[0])]


def test_vllm_args_naming_a_hostile_config_file_stop_the_start_in_one_line(
    tmp_path: Path,
) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BILLION_LAUGHS)
    for path, why in [(bomb, "YAML aliases"), (Path("/dev/zero"), "a character device")]:
        with pytest.raises(ConfigError, match=f"--config {path}: {why}"):
            built("--vllm.args", f"/models/gemma --config {path}")


def test_a_hugging_face_id_is_derived_from_the_hf_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's quickstart: `vllm serve google/gemma-3-27b-it`, no shared volume, the
    sidecar's HF cache holds the model's config.json."""
    local = simulated_deployment(tmp_path / "local")
    cache = tmp_path / "hub"
    _cache_gemma(cache, local)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    simulation = dataclasses.replace(local, model_path="google/gemma-3-27b-it", engines={})
    url = simulation.start()
    views = _polled_once(simulation, url)
    assert [v.derivation_error for v in views] == [None, None]
    assert {v.derived_kv_cache_size_tokens for v in views} == {
        local.plan.capacity.kv_cache_size_tokens
    }


def _fake_vllm_process(proc: Path, pid: int, argv: list[str], environ: dict[str, str]) -> Path:
    entry = proc / str(pid)
    entry.mkdir(parents=True)
    (entry / "cmdline").write_bytes(b"\0".join(w.encode() for w in argv) + b"\0")
    (entry / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))
    return entry


def test_the_hf_cache_variables_of_the_vllm_process_are_read_from_proc(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    vllm = ["vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "8000"]
    env = {"HF_HOME": "/models/huggingface", "PATH": "/usr/bin", "SECRET": "x", "HF_TOKEN": "t"}
    entry = _fake_vllm_process(proc, 17, vllm, env)
    _fake_vllm_process(proc, 18, ["vllm", "serve", "other", "--port", "9000"], {"HF_HOME": "/b"})
    # Only the cache's variables, of the server on the sidecar's port.
    assert vllm_processes.discover_hf_environ(proc, 8000) == {"HF_HOME": "/models/huggingface"}
    assert vllm_processes.discover_hf_environ(proc, 9000) == {"HF_HOME": "/b"}
    assert vllm_processes.discover_hf_environ(proc, 7000) == {}  # two servers, none on the port
    # Another user's process: its environment cannot be read, and nothing is made up.
    (entry / "environ").unlink()
    (entry / "environ").mkdir()
    assert vllm_processes.discover_hf_environ(proc, 8000) == {}


def _gemma_served_by_a_vllm_process(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    sidecar_hf_home: Path,
    vllm_hf_home: Path | None,
) -> tuple[SimulatedVllm, SimulatedVllm, str, Path, int]:
    """Gemma 3 cached under models/huggingface, served by id from a simulated vLLM whose
    process (pid 17 in a fake /proc) names it; the sidecar's HF_HOME and the vLLM
    process's (None: not set) as the test says. (deployment, served, url, /proc, port)"""
    local = simulated_deployment(tmp_path / "local")
    _cache_gemma(tmp_path / "models" / "huggingface" / "hub", local)
    monkeypatch.setenv("HF_HOME", str(sidecar_hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    simulation = dataclasses.replace(local, model_path="google/gemma-3-27b-it", engines={})
    url = simulation.start()
    proc = tmp_path / "proc"
    port = int(url.rpartition(":")[2])
    argv = ["vllm", "serve", "google/gemma-3-27b-it", "--port", str(port)]
    environ = {} if vllm_hf_home is None else {"HF_HOME": str(vllm_hf_home)}
    _fake_vllm_process(proc, 17, argv, environ)
    return local, simulation, url, proc, port


def test_a_hugging_face_id_found_through_the_vllm_process_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar's own HF_HOME points elsewhere; vLLM's (read from /proc) has the model."""
    home = tmp_path / "models" / "huggingface"
    local, simulation, url, proc, _ = _gemma_served_by_a_vllm_process(
        tmp_path, monkeypatch, sidecar_hf_home=tmp_path / "elsewhere", vllm_hf_home=home
    )
    real = vllm_processes.discover_hf_environ
    monkeypatch.setattr(vllm_http, "discover_hf_environ", lambda port: real(proc, port))
    views = _polled_once(simulation, url)
    assert [v.derivation_error for v in views] == [None, None]
    assert {v.derived_kv_cache_size_tokens for v in views} == {
        local.plan.capacity.kv_cache_size_tokens
    }


def test_a_poll_looks_for_the_vllm_command_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served Hugging Face id, found through the vLLM process in /proc: the poll that
    looks it up in the cache uses the command line it found, not a second walk of /proc."""
    home = tmp_path / "models" / "huggingface"
    _, simulation, url, proc, port = _gemma_served_by_a_vllm_process(
        tmp_path, monkeypatch, sidecar_hf_home=home, vllm_hf_home=None
    )
    walks = []

    def discover(port: int | None = None, **kwargs: object) -> object:
        walks.append(port)
        return vllm_processes.discover_serve_args(proc, port, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(vllm_http, "discover_serve_args", discover)
    try:
        settings = VllmHttpSettings(urls=(url,))
        ServerPoller(url, settings, fetch, StateStore(), threading.Event()).poll_once()
    finally:
        simulation.stop()
    assert walks == [port]


def test_a_hugging_face_id_not_in_the_cache_says_where_kvcap_looked_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = simulated_deployment(tmp_path / "local")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setattr(vllm_http, "discover_hf_environ", lambda port: {})
    # The deployment's engines are served: their readings carry warnings of their own, and
    # the one about the cache must still be said once, not on every poll.
    simulation = dataclasses.replace(local, model_path="google/gemma-3-27b-it")
    url = simulation.start()
    try:
        store = StateStore()
        told = parse_vllm_serve_args(simulation.vllm_args)
        settings = VllmHttpSettings(urls=(url,), serve_args=told)
        poller = ServerPoller(url, settings, fetch, store, threading.Event())
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):
                poller.poll_once()
    finally:
        simulation.stop()
    where = str(tmp_path / "empty" / "hub")
    errors = {v.derivation_error for v in store.snapshot().engines}
    assert len(errors) == 1
    (error,) = errors
    assert error is not None
    assert where in error
    assert "google/gemma-3-27b-it" in error
    warned = [e for e in logs if e["event"] == "model_config_not_found"]
    assert len(warned) == 1, logs
    assert where in warned[0]["error"], logs


def test_a_hostile_proc_environ_is_read_within_its_bound(tmp_path: Path) -> None:
    """3 MiB without a separator, then HF_HOME; bytes that are not UTF-8: read up to
    MAX_ENVIRON_BYTES (the kernel's own limit), only the cache variables kept."""
    proc = tmp_path / "proc"
    entry = _fake_vllm_process(proc, 17, ["vllm", "serve", "m"], {})
    huge = b"A" * (3 * 2**20) + b"\0HF_HOME=/far\0"
    (entry / "environ").write_bytes(huge)
    assert vllm_processes.discover_hf_environ(proc, 8000) == {}
    (entry / "environ").write_bytes(b"\xff\xfe=\x00HF_HOME=/m\xffodels\0HF_HUB_CACHE=\0")
    assert vllm_processes.discover_hf_environ(proc, 8000) == {"HF_HOME": "/m\ufffdodels"}


def _cache_gemma(hub: Path, local: SimulatedVllm) -> None:
    """The simulated deployment's config.json in a Hugging Face cache, under Gemma 3's id."""
    config = json.dumps(dict(local.config)).encode()
    add_snapshot(hub, "google/gemma-3-27b-it", COMMIT, {"config.json": config})
    set_ref(hub, "google/gemma-3-27b-it", "main", COMMIT)


def _polled_once(simulation: SimulatedVllm, url: str) -> tuple[EngineView, ...]:
    """One poll of the simulated server as `--vllm.args` names it; the engine views."""
    try:
        store = StateStore()
        told = parse_vllm_serve_args(simulation.vllm_args)
        settings = VllmHttpSettings(urls=(url,), serve_args=told)
        ServerPoller(url, settings, fetch, store, threading.Event()).poll_once()
    finally:
        simulation.stop()
    return store.snapshot().engines
