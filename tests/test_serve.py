"""`kvcap-exporter serve` and `demo` as real processes: flags, environment, signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest


class Started(subprocess.Popen[str]):
    """A process that is killed, not waited for forever, when a test fails inside `with`."""

    def __exit__(self, *exc: object) -> None:
        if self.poll() is None:
            self.kill()
        super().__exit__(*exc)  # type: ignore[arg-type]


def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return Started(
        [sys.executable, "-m", "exporter.cli", *args],
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
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "serve",
            "--web.listen-address",
            "127.0.0.1:0",
            "--web.config.file",
            str(config),
        ],
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
        [sys.executable, "-m", "exporter.cli", "serve", "--help"],
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
