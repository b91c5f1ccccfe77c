"""The daemon in its own process under real SIGHUPs: storms coalesced, bad headers refused.

What is counted rather than timed: the reloads the daemon performed and the lines it
logged (from its own log), and the CPU time it spent, against the cost of one bcrypt
check measured in the same run (a storm that dropped the bcrypt cache would pay two
checks per reload: the new authenticator's dummy hash and the next login).
"""

from __future__ import annotations

import base64
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import bcrypt
import pytest

from exporter.serve import RELOAD_INTERVAL_S
from tests.faults.hostile import daemon, scrape
from tests.support import cli_command

pytestmark = pytest.mark.process

# bcrypt's cost 13: half a second of CPU a check, so a storm that pays bcrypt stands out
# from everything else the daemon does in it.
ROUNDS = 13
SIGNALS = 1000
CSP_CAFE = "http_server_config:\n  headers:\n    Content-Security-Policy: 'café'\n"


def one_bcrypt_check_s(hashed: bytes) -> float:
    began = time.process_time()
    bcrypt.checkpw(b"right", hashed)
    return time.process_time() - began


def test_a_sighup_storm_is_coalesced_and_keeps_the_bcrypt_cache(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=ROUNDS))
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  alice: '{hashed.decode()}'\n")
    alice = {"Authorization": "Basic " + base64.b64encode(b"alice:right").decode()}
    with daemon(f"--web.config.file={config}") as target:
        assert scrape(target, headers=alice).status == 200  # the one bcrypt check it needs
        logged_before, cpu_before = len(target.log), target.cpu_s()
        began = time.monotonic()
        statuses = []
        for sent in range(1, SIGNALS + 1):
            os.kill(target.process.pid, signal.SIGHUP)
            if sent % 50 == 0:
                statuses.append(scrape(target, headers=alice).status)
            time.sleep(0.002)
        storm_s = time.monotonic() - began
        time.sleep(RELOAD_INTERVAL_S + 0.5)  # the last pending reload runs
        cpu_s = target.cpu_s() - cpu_before
        lines = target.log[logged_before:]
        assert target.process.poll() is None
        # SIGTERM right behind more SIGHUPs still stops it, cleanly.
        for _ in range(50):
            os.kill(target.process.pid, signal.SIGHUP)
        target.process.send_signal(signal.SIGTERM)
        assert target.process.wait(10) == 0
    assert statuses == [200] * (SIGNALS // 50)
    reloads = [line for line in lines if "exporter_reloading" in line]
    # One reload at a time, at most one pending, one a second: not one per signal.
    assert 1 <= len(reloads) <= storm_s / RELOAD_INTERVAL_S + 2, (storm_s, reloads)
    counts = [re.search(r"signals=(\d+)", line) for line in reloads]
    coalesced = sum(int(count[1]) for count in counts if count is not None)
    assert len(reloads) < coalesced <= SIGNALS
    # Nothing changed: a line per reload performed, and nothing else.
    assert lines == reloads, lines
    # Fewer than one bcrypt check in the whole storm (dropping the cache: 2 per reload).
    bcrypt_s = one_bcrypt_check_s(hashed)
    print(
        f"{coalesced} signals in {storm_s:.1f} s: {len(reloads)} reloads, {len(lines)} lines, "
        f"{cpu_s:.2f} s CPU (one bcrypt check: {bcrypt_s:.2f} s)"
    )
    assert cpu_s < bcrypt_s, (cpu_s, len(reloads))


def test_a_bad_header_at_start_up_is_one_line_and_exit_1(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text(CSP_CAFE, encoding="utf-8")
    result = subprocess.run(
        cli_command(
            "serve",
            "--web.listen-address=127.0.0.1:0",
            f"--web.config.file={config}",
            "--no-collector.nvml",
            "--no-collector.vllm_http",
            "--no-collector.handshake",
            "--no-collector.kv_events",
        ),
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert "http_server_config.headers.Content-Security-Policy" in result.stderr
    assert "visible ASCII" in result.stderr


def test_a_bad_header_on_sighup_is_refused_counted_and_every_answer_kept(tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    config.write_text("http_server_config:\n  headers:\n    X-Frame-Options: deny\n")
    with daemon(f"--web.config.file={config}") as target:
        config.write_text(CSP_CAFE, encoding="utf-8")
        target.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not target.logged("web_config_reload_failed") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(target.logged("web_config_reload_failed")) == 1
        counter = "kvcap_web_config_reload_errors_total"
        assert target.counter(counter, reason="invalid") == 1
        for path in ("/healthz", "/metrics", "/"):
            reply = scrape(target, path)
            assert reply.status == 200, path
            assert reply.body, path
