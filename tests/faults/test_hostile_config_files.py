"""A vLLM process whose command line names a hostile `--config` file, discovered through
/proc by a kvcap daemon in its own process: bounded RSS, scrapes served, one log line, no
traceback, SIGTERM still ends it (issue 25, item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from exporter import examples
from tests.collectors.test_vllm_http_hostile import GEMMA, metrics_only, stand_in
from tests.faults.hostile import MAX_RSS_MIB, SCRAPE_WITHIN_S, Daemon, daemon, scrape
from tests.test_bounded_files import BILLION_LAUGHS

GEMMA_CONFIG = Path(examples.__file__).parent / "gemma-3-27b-text.json"


@contextmanager
def fake_vllm(folder: Path, *flags: str) -> Iterator[subprocess.Popen[bytes]]:
    """A process whose /proc/PID/cmdline is `python .../vllm serve FLAGS`, as the `vllm`
    console script's is; it only sleeps (the API server is the stand-in)."""
    script = folder / "vllm"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    script.chmod(0o755)
    process = subprocess.Popen([str(script), "serve", "/models/gemma", *flags])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


@contextmanager
def daemon_beside_a_vllm_with_config(folder: Path, config: str) -> Iterator[Daemon]:
    """A daemon polling a stand-in vLLM API server every 0.25 s, whose process (a fake
    `vllm serve`) names `--config CONFIG` on its command line."""
    with (
        stand_in(metrics_only(GEMMA.read_bytes())) as (url, _),
        fake_vllm(folder, "--config", config, "--port", url.rsplit(":", 1)[1]),
        daemon(
            "--collector.vllm_http",
            f"--vllm.url={url}",
            "--vllm.poll-interval=0.25",
            f"--model.config={GEMMA_CONFIG}",
        ) as target,
    ):
        yield target


def _hostile_file(folder: Path, kind: str) -> str:
    """The path the fake vLLM's --config names."""
    if kind == "dev-zero":
        return "/dev/zero"
    path = folder / "vllm.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # no writer ever comes
    elif kind == "sparse-1gib":
        with path.open("wb") as handle:
            handle.truncate(2**30)
    else:
        path.write_text(BILLION_LAUGHS)
    return str(path)


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("fifo", "file_not_regular"),
        ("dev-zero", "file_not_regular"),
        ("sparse-1gib", "file_too_large"),
        ("billion-laughs", "file_malformed"),
    ],
)
def test_a_hostile_config_file_of_a_discovered_vllm_is_one_counted_refusal(
    tmp_path: Path, kind: str, reason: str
) -> None:
    config = _hostile_file(tmp_path, kind)
    with daemon_beside_a_vllm_with_config(tmp_path, config) as target:
        time.sleep(2.0)  # 8 polls: the file must be read once, not once a poll
        reply = scrape(target)
        engines = scrape(target, "/engines").body.decode()
        peak = target.peak_rss_mib()
        errors = target.counter(
            "kvcap_collector_errors_total", collector="vllm_http", reason=reason
        )
        exit_s = target.sigterm_s()
    log = "".join(target.log)
    print(
        f"--config {kind}: peak RSS {peak:.1f} MiB, scrape {reply.elapsed_s:.3f} s, "
        f"{errors:.0f} counted, SIGTERM exit {exit_s:.2f} s"
    )
    assert reply.status == 200
    assert reply.elapsed_s < SCRAPE_WITHIN_S
    assert peak < MAX_RSS_MIB
    assert exit_s < 2.0
    assert errors == 1  # once per version of the file, not once a poll
    assert f"engine settings unknown: --config {config}: " in engines
    # The engines are still exported with vLLM's own figures.
    assert b"kvcap_kv_cache_capacity_tokens{" in reply.body
    assert [line for line in target.log if config in line] == target.logged("input_rejected")
    assert len(target.logged("input_rejected")) == 1
    assert "Traceback" not in log


def test_a_config_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    """Fixed in place, the file is read at its next version and the engines derived."""
    config = tmp_path / "vllm.yaml"
    config.write_text(BILLION_LAUGHS)
    with daemon_beside_a_vllm_with_config(tmp_path, str(config)) as target:
        time.sleep(1.0)
        assert "engine settings unknown" in scrape(target, "/engines").body.decode()
        replacement = tmp_path / "vllm.yaml.new"
        replacement.write_text("tensor_parallel_size: 2\nmax_model_len: 131072\n")
        replacement.rename(config)
        time.sleep(1.0)
        engines = scrape(target, "/engines").body.decode()
    assert "engine settings unknown" not in engines


@pytest.mark.parametrize(
    ("kind", "reason"), [("fifo", "file_not_regular"), ("sparse-1gib", "file_too_large")]
)
def test_a_hostile_model_config_json_is_one_counted_refusal(
    tmp_path: Path, kind: str, reason: str
) -> None:
    """`--model.config` (a shared volume vLLM's side may write to) a FIFO or 1 GiB."""
    config = tmp_path / "config.json"
    if kind == "fifo":
        os.mkfifo(config)
    else:
        with config.open("wb") as handle:
            handle.truncate(2**30)
    with (
        stand_in(metrics_only(GEMMA.read_bytes())) as (url, _),
        daemon(
            "--collector.vllm_http",
            f"--vllm.url={url}",
            "--vllm.poll-interval=0.25",
            f"--model.config={config}",
        ) as target,
    ):
        time.sleep(2.0)
        reply = scrape(target)
        peak = target.peak_rss_mib()
        errors = target.counter(
            "kvcap_collector_errors_total", collector="vllm_http", reason=reason
        )
    print(f"config.json {kind}: peak RSS {peak:.1f} MiB, scrape {reply.elapsed_s:.3f} s")
    assert reply.status == 200
    assert reply.elapsed_s < SCRAPE_WITHIN_S
    assert peak < MAX_RSS_MIB
    assert errors == 1
    assert b"kvcap_kv_cache_capacity_tokens{" in reply.body
    assert len([line for line in target.log if str(config) in line]) == 1
    assert "Traceback" not in "".join(target.log)
