"""`kvcap-exporter serve` and `demo` as real processes: flags, environment, signals."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from exporter.cli import build_parser
from exporter.demo import simulated_deployment
from exporter.flags import Flags, duration, size
from tests.support import cli_command


class Started(subprocess.Popen[str]):
    """A process that is killed, not waited for forever, when a test fails inside `with`."""

    def __exit__(self, *exc: object) -> None:
        if self.poll() is None:
            self.kill()
        super().__exit__(*exc)  # type: ignore[arg-type]


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return Started(
        cli_command(*args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def wait_for_log(process: subprocess.Popen[str], needle: str, timeout_s: float = 15) -> str:
    assert process.stderr is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if needle in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"no log line with {needle!r}")


def stop_within(process: subprocess.Popen[str], signum: int, limit_s: float = 2.0) -> float:
    began = time.monotonic()
    process.send_signal(signum)
    process.wait(limit_s + 3)
    elapsed = time.monotonic() - began
    assert elapsed < limit_s, f"took {elapsed:.2f}s to stop"
    return elapsed


def url_from(line: str) -> str:
    return next(part.split("=", 1)[1] for part in line.split() if part.startswith("url="))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_cleanly_on_signals(signum: int) -> None:
    with start("serve", "--web.listen-address", "127.0.0.1:0") as process:
        url = url_from(wait_for_log(process, "exporter_started"))
        with urllib.request.urlopen(url + "/healthz", timeout=5) as response:
            assert response.read() == b"ok\n"
        stop_within(process, signum)
        assert process.returncode == 0


def test_environment_twins_set_flags() -> None:
    env = {
        "KVCAP_WEB_LISTEN_ADDRESS": "127.0.0.1:0",
        "KVCAP_LOG_FORMAT": "json",
        "KVCAP_LOG_LEVEL": "info",
    }
    with start("serve", env=env) as process:
        line = wait_for_log(process, "exporter_started")
        assert line.startswith("{")
        assert '"url": "http://127.0.0.1:' in line
        stop_within(process, signal.SIGTERM)


def test_bad_web_config_is_a_startup_error_naming_the_field(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text("tls_server_config:\n  min_version: TLS99\n")
    run = subprocess.run(
        cli_command(
            "serve",
            "--web.listen-address",
            "127.0.0.1:0",
            "--web.config.file",
            str(config),
        ),
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    assert run.returncode == 1
    assert "tls_server_config" in run.stderr
    assert "Traceback" not in run.stderr


def test_help_lists_environment_twins() -> None:
    run = subprocess.run(
        cli_command("serve", "--help"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert "KVCAP_WEB_LISTEN_ADDRESS" in run.stdout
    assert "KVCAP_WEB_CONFIG_FILE" in run.stdout


def test_demo_prints_a_working_scrape_url() -> None:
    with start("demo", "--web.listen-address", "127.0.0.1:0") as process:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(6)]
        scrape = next(line.split()[1] for line in lines if line.startswith("scrape:"))
        body = ""
        deadline = time.monotonic() + 10
        while "kvcap_kv_cache_capacity_tokens{" not in body and time.monotonic() < deadline:
            with urllib.request.urlopen(scrape, timeout=5) as response:
                body = response.read().decode()
            time.sleep(0.2)
        capacity = [
            line for line in body.splitlines() if line.startswith("kvcap_kv_cache_capacity_tokens{")
        ]
        assert len(capacity) == 2
        stop_within(process, signal.SIGTERM)


def test_the_demos_index_lists_its_flags_as_serve_does() -> None:
    with start("demo", "--web.listen-address", "127.0.0.1:0", "--log.level", "warn") as process:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(6)]
        scrape = next(line.split()[1] for line in lines if line.startswith("scrape:"))
        with urllib.request.urlopen(scrape.removesuffix("/metrics") + "/", timeout=5) as page:
            body = page.read().decode()
        stop_within(process, signal.SIGTERM)
    assert "--web.listen-address" in body
    assert "127.0.0.1:0" in body
    assert "--log.level" in body


def test_the_demo_serves_with_the_web_flags_it_lists() -> None:
    """`--web.max-requests` (and `--web.config.allow-downgrade`, passed the same way) reach
    the demo's server: with a cap of 1, a second connection makes room by closing the first,
    which waits in the middle of its request head, and the eviction is counted."""
    with start("demo", "--web.listen-address", "127.0.0.1:0", "--web.max-requests", "1") as process:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(6)]
        scrape = next(line.split()[1] for line in lines if line.startswith("scrape:"))
        host, port = scrape.split("/")[2].split(":")
        with socket.create_connection((host, int(port)), timeout=5) as first:
            first.sendall(b"GET /metrics HTTP/1.1\r\n")  # a head begun
            time.sleep(0.3)
            with urllib.request.urlopen(scrape, timeout=5) as response:
                body = response.read().decode()
            assert first.recv(4096) == b""  # closed to make room
        stop_within(process, signal.SIGTERM)
    assert 'kvcap_web_requests_rejected_total{reason="evicted"} 1.0' in body


def run_briefly(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_command(*args),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_a_taken_port_is_one_line_naming_the_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = run_briefly("serve", "--web.listen-address", f"127.0.0.1:{port}")
    assert run.returncode == 1
    errors = [line for line in run.stderr.splitlines() if not line.startswith("ts=")]
    assert errors == [
        f"kvcap-exporter: error: --web.listen-address 127.0.0.1:{port}: cannot listen: "
        "address already in use"
    ]
    assert "stopped" not in run.stderr  # nothing had started


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (["--vllm.poll-interval", "soon"], {}, "argument --vllm.poll-interval: not a duration"),
        (["--vllm.poll-interval", "0s"], {}, "must be longer than zero"),
        (["--log.level", "loud"], {}, "argument --log.level: not a log level"),
        (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
        ([], {"KVCAP_VLLM_TIMEOUT": "later"}, "KVCAP_VLLM_TIMEOUT: not a duration"),
        ([], {"KVCAP_COLLECTOR_NVML": "maybe"}, "KVCAP_COLLECTOR_NVML must be true or false"),
        (["--vllm.url", "http://x", "--vllm.args", "m -tp x"], {}, "-tp must be an integer"),
    ],
)
def test_usage_errors_exit_2_in_one_line(args: list[str], env: dict[str, str], needle: str) -> None:
    run = run_briefly("serve", "--web.listen-address", "127.0.0.1:0", *args, env=env)
    assert run.returncode == 2
    assert run.stderr.startswith("kvcap-exporter: error:")
    assert run.stderr.count("\n") == 1
    assert needle in run.stderr


def test_an_unexpected_error_has_a_traceback_only_at_debug() -> None:
    code = (
        "import sys; from exporter import cli, serve\n"
        "def broken(args): raise RuntimeError('disk on fire')\n"
        "serve.run = broken\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    for level, traced in (("info", False), ("debug", True)):
        run = subprocess.run(
            [sys.executable, "-c", code, "serve", "--log.level", level],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert run.returncode == 1
        assert run.stderr.splitlines()[-1] == "kvcap-exporter: error: RuntimeError: disk on fire"
        assert ("Traceback" in run.stderr) is traced


def test_durations_warning_level_and_logfmt_values() -> None:
    with start(
        "serve", "--web.listen-address", "127.0.0.1:0", "--vllm.poll-interval", "250ms",
        "--nvml.poll-interval", "1m", "--log.level", "info",
    ) as process:  # fmt: skip
        started = wait_for_log(process, "exporter_started")
        assert "collectors=" in started
        assert "[" not in started
        url = url_from(started)
        with urllib.request.urlopen(url + "/", timeout=5) as response:
            page = response.read().decode()
        # As given (issue 23): not 0.25 and 60.0.
        assert "<code>--vllm.poll-interval</code></td><td><code>250ms</code>" in page
        assert "<code>--nvml.poll-interval</code></td><td><code>1m</code>" in page
        assert "<code>--web.listen-address</code></td><td><code>127.0.0.1:0</code>" in page
        stop_within(process, signal.SIGTERM)
    with start("serve", "--web.listen-address", "127.0.0.1:0", "--log.level", "warning") as quiet:
        time.sleep(1.5)
        assert quiet.poll() is None  # accepted and running
        stop_within(quiet, signal.SIGTERM)
        assert quiet.stderr is not None
        assert "level=info" not in quiet.stderr.read()


def test_logfmt_booleans_are_values_not_bare_keys(tmp_path: Path) -> None:
    with start("serve", "--web.listen-address", "127.0.0.1:0") as process:
        line = wait_for_log(process, "web_server_started")
        assert "basic_auth=false" in line
        stop_within(process, signal.SIGTERM)


@pytest.mark.parametrize("command", ["serve", "demo", "capacity"])
def test_every_flags_help_shows_its_default_and_environment_twin(command: str) -> None:
    run = run_briefly(command, "--help")
    assert run.returncode == 0
    text = " ".join(run.stdout.split())
    _, commands = build_parser()
    flags = next(f for f in commands if f.parser.prog.endswith(f" {command}"))
    assert flags.declared
    for flag in flags.declared:
        assert re.search(rf"\(default [^()]*(\([^()]*\)[^()]*)*; env {flag.env}\)", text), flag
        # The metavar says what the value is, never the raw destination name.
        assert f"{flag.option} {flag.dest.upper()}" not in text


def test_no_argparse_internals_are_reached_for() -> None:
    """Flags are declared with their twins (exporter/flags.py); nothing walks the parser."""
    exporter = Path(__file__).parent.parent / "exporter"
    for source in exporter.rglob("*.py"):
        text = source.read_text(encoding="utf-8")
        assert "._actions" not in text, source
        assert "_SubParsersAction" not in text, source


def engines_with_warnings(url: str, deadline_s: float = 15.0) -> list[dict[str, Any]]:
    """/engines once every engine has been derived or refused (a poll or two)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/engines", timeout=5) as response:
            engines: list[dict[str, Any]] = json.load(response)["engines"]
        if engines and all(e["derived_kv_cache_size_tokens"] is not None for e in engines):
            return engines
        time.sleep(0.2)
    raise AssertionError("the engines were never derived")


@pytest.mark.parametrize("told", ["wrong", "right"])
def test_settings_kvcap_is_told_are_checked_against_the_engine(tmp_path: Path, told: str) -> None:
    """The issue's case: --vllm.args for Qwen at 8192 tokens beside Gemma at TP2/DP2 and
    131,072 tokens. Each contradiction is logged once, listed in /engines and counted."""
    simulation = simulated_deployment(tmp_path / "gemma")
    simulation.start()
    args = (
        "Qwen/Qwen3-0.6B -tp 2 --max-model-len 8192" if told == "wrong" else (simulation.vllm_args)
    )
    try:
        with start(
            "serve", "--web.listen-address", "127.0.0.1:0", "--no-collector.handshake",
            "--no-collector.nvml", "--vllm.url", simulation.url, "--vllm.poll-interval", "200ms",
            "--vllm.args", args, "--model.config", str(tmp_path / "gemma"),
        ) as process:  # fmt: skip
            url = url_from(wait_for_log(process, "exporter_started"))
            engines = engines_with_warnings(url)
            time.sleep(1.0)  # several more polls that see the same contradictions
            with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
                metrics = response.read().decode()
            stop_within(process, signal.SIGTERM)
            assert process.stderr is not None
            log = process.stderr.read()
    finally:
        simulation.stop()
    mismatches = [line for line in metrics.splitlines()
                  if line.startswith("kvcap_engine_settings_mismatch{")]  # fmt: skip
    logged = [line for line in log.splitlines() if "engine_settings_mismatch" in line]
    if told == "right":
        assert [e["settings_warnings"] for e in engines] == [[], []]
        assert mismatches == []
        assert logged == []
        return
    expected = {"served_model_name", "max_model_len", "data_parallel_size"}
    for engine in engines:
        assert {w["field"] for w in engine["settings_warnings"]} == expected
        length = next(w for w in engine["settings_warnings"] if w["field"] == "max_model_len")
        assert (length["told"], length["seen"], length["source"]) == (
            "8192",
            "131072",
            "/v1/models",
        )
    assert len(mismatches) == 2 * len(expected)
    assert 'field="max_model_len"' in " ".join(mismatches)
    assert len(logged) == 2 * len(expected)  # once per engine and setting, not per poll


def test_choice_twins_are_checked_as_their_flags() -> None:
    """KVCAP_LOG_FORMAT=text and KVCAP_VLLM_PLATFORM=gpu: exit 2, one line, as the flags."""
    for variable, value, valid in (
        ("KVCAP_LOG_FORMAT", "text", "logfmt"),
        ("KVCAP_VLLM_PLATFORM", "gpu", "cuda"),
    ):
        run = run_briefly("serve", "--web.listen-address", "127.0.0.1:0", env={variable: value})
        assert run.returncode == 2, (variable, run.stderr)
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert variable in run.stderr
        assert repr(value) in run.stderr
        assert valid in run.stderr


def test_flags_show_as_they_were_given() -> None:
    """`/` lists the active flags: `5s` and `8MiB` as typed, defaults in the same units."""
    parser = argparse.ArgumentParser()
    flags = Flags(parser)
    group = flags.group("vllm")
    group.add("--vllm.poll-interval", metavar="D", type=duration, default=5.0, help="h")
    group.add("--vllm.timeout", metavar="D", type=duration, default=2.0, help="h")
    group.add("--vllm.max-body-size", metavar="S", type=size, default=8 * 2**20, help="h")
    group.add("--vllm.cache", metavar="S", type=size, default=2**20, help="h")
    flags.apply_environment({"KVCAP_VLLM_CACHE": "1048576"})
    args = parser.parse_args(["--vllm.poll-interval=1m30s", "--vllm.max-body-size", "16MiB"])
    assert dict(flags.active(args)) == {
        "--vllm.poll-interval": "1m30s",
        "--vllm.timeout": "2s",
        "--vllm.max-body-size": "16MiB",
        "--vllm.cache": "1048576",
    }


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1:8000", "127.0.0.1:8000", "http://:80", "http://h:99999"]
)
def test_a_vllm_url_that_is_not_http_is_refused_at_start_up(url: str) -> None:
    for args, env in (
        (["--vllm.url", url], {}),
        ([], {"KVCAP_VLLM_URL": url}),
    ):
        run = run_briefly("serve", "--web.listen-address", "127.0.0.1:0", *args, env=env)
        assert run.returncode == 2, (url, run.stderr)
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert "http://" in run.stderr
        assert "KVCAP_VLLM_URL" in run.stderr or "--vllm.url" in run.stderr
