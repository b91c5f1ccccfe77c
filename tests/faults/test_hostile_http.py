"""Hostile HTTP clients against a kvcap daemon process: each attack bounded, scrapes still served.

Every test runs the attack from real sockets against `kvcap-exporter serve` in its own
process and asserts the issue's bounds on the daemon: a legitimate scrape during the attack
answers 200 within SCRAPE_WITHIN_S, peak RSS stays under MAX_RSS_MIB, threads under the
connection cap + THREAD_SLACK, and the attack's requests are counted in
kvcap_web_requests_rejected_total.
"""

from __future__ import annotations

import base64
import contextlib
import signal
import socket
import threading
import time
from pathlib import Path

import bcrypt
import pytest

from tests.faults.hostile import (
    MAX_RSS_MIB,
    SCRAPE_WITHIN_S,
    THREAD_SLACK,
    Daemon,
    close_all,
    daemon,
    during,
    raw_connections,
    scrape,
)

CAP = 40  # --web.max-requests' default
WRONG = "Basic " + base64.b64encode(b"alice:wrong").decode()


def assert_scrapes_are_served(target: Daemon, count: int = 5, **kwargs: object) -> float:
    """`count` legitimate scrapes, one after another; returns the slowest."""
    slowest = 0.0
    for _ in range(count):
        reply = scrape(target, **kwargs)  # type: ignore[arg-type]
        assert reply.status == 200
        slowest = max(slowest, reply.elapsed_s)
        time.sleep(0.05)
    assert slowest < SCRAPE_WITHIN_S
    return slowest


def huge_head(stop: threading.Event, port: int, finish: bool) -> None:
    """Sends 6.4 MB heads (100 x 64 KiB header lines) with wrong credentials, again and again;
    `finish=False` leaves each one unfinished and holds the connection open."""
    line = b"X-Pad: " + b"a" * (64 * 1024 - 9) + b"\r\n"
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(
                    f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {WRONG}\r\n".encode()
                )
                for _ in range(100):
                    sock.sendall(line)
                if finish:
                    sock.sendall(b"\r\n")
                sock.recv(1024)
        except OSError:  # the server answered 431 and closed while we were still sending
            pass


@pytest.mark.parametrize("finish", [True, False], ids=["finished", "unfinished"])
def test_huge_heads_cost_at_most_the_head_budget(finish: bool) -> None:
    with daemon() as target:
        end = during(lambda stop: huge_head(stop, target.port, finish), workers=10)
        try:
            time.sleep(1.0)
            slowest = assert_scrapes_are_served(target)
            threads = target.threads()
        finally:
            end()
        rejected = target.counter("kvcap_web_requests_rejected_total", reason="head_too_large")
        peak = target.peak_rss_mib()
    print(
        f"huge heads ({finish=}): slowest scrape {slowest:.3f} s, peak RSS {peak:.1f} MiB, "
        f"{threads} threads, {rejected:.0f} refused"
    )
    assert peak < MAX_RSS_MIB
    assert threads < CAP + THREAD_SLACK
    assert rejected >= 10


def test_idle_connection_flood_cannot_lock_scrapers_out() -> None:
    with daemon() as target:
        idle = raw_connections(target, 200)
        try:
            time.sleep(0.5)
            threads = target.threads()
            slowest = assert_scrapes_are_served(target)
        finally:
            close_all(idle)
        evicted = target.counter("kvcap_web_requests_rejected_total", reason="evicted")
    print(
        f"200 idle connections: {threads} threads, slowest scrape {slowest:.3f} s, "
        f"{evicted:.0f} evicted"
    )
    assert threads < CAP + THREAD_SLACK
    assert evicted >= 200 - CAP


def slowloris(stop: threading.Event, port: int, connections: int) -> None:
    """`connections` heads, each trickled a byte every 0.5 s; a closed one is reopened."""
    sockets: list[socket.socket | None] = [None] * connections
    head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 1000
    sent = 0
    while not stop.is_set():
        for index, open_socket in enumerate(sockets):
            sock = open_socket
            try:
                if sock is None:
                    sock = sockets[index] = socket.create_connection(("127.0.0.1", port), 5)
                sock.send(head[sent % len(head) : sent % len(head) + 1])
            except OSError:
                if sock is not None:
                    sock.close()
                sockets[index] = None
        sent += 1
        stop.wait(0.5)
    close_all([s for s in sockets if s is not None])


def test_slowloris_cannot_hold_the_server() -> None:
    with daemon() as target:
        end = during(lambda stop: slowloris(stop, target.port, 100), workers=3)
        try:
            time.sleep(2.0)
            threads = target.threads()
            slowest = assert_scrapes_are_served(target)
        finally:
            end()
    print(f"slowloris (300 connections): {threads} threads, slowest scrape {slowest:.3f} s")
    assert threads < CAP + THREAD_SLACK


def test_file_descriptors_used_up_back_off_and_log_once() -> None:
    # No connection cap, so the attack can use every descriptor the daemon has.
    with daemon("--web.max-requests=0", nofile=64) as target:
        time.sleep(0.3)
        flood = raw_connections(target, 80)  # the kernel accepts them; kvcap cannot
        try:
            time.sleep(0.5)
            cpu_before, began = target.cpu_s(), time.monotonic()
            time.sleep(2.0)
            cpu_share = (target.cpu_s() - cpu_before) / (time.monotonic() - began)
        finally:
            close_all(flood)
        assert len(target.logged("web_accept_failing")) == 1
        time.sleep(0.5)
        slowest = assert_scrapes_are_served(target, count=2)
        assert target.counter("kvcap_web_requests_rejected_total", reason="accept_failed") >= 1
        assert target.logged("web_accept_recovered")
    print(f"no descriptors left: {cpu_share:.1%} CPU, scrape after {slowest:.3f} s")
    assert cpu_share < 0.10  # busy-looping accept() took 71 %


def test_the_connection_cap_keeps_descriptors_for_scrapes() -> None:
    with daemon(nofile=64) as target:
        flood = raw_connections(target, 80)
        try:
            time.sleep(0.5)
            slowest = assert_scrapes_are_served(target)
        finally:
            close_all(flood)
        assert not target.logged("web_accept_failing")
    print(f"80 connections under nofile 64, cap 40: slowest scrape {slowest:.3f} s")


def test_a_flood_of_bad_passwords_does_not_hold_up_a_valid_login(tmp_path: Path) -> None:
    # Cost 10, exporter-toolkit's documented example: tens of ms per check on these cores.
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=10)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  alice: '{hashed}'\n")
    valid = {"Authorization": "Basic " + base64.b64encode(b"alice:right").decode()}

    def flood(stop: threading.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                scrape(target, headers={"Authorization": WRONG})

    with daemon(f"--web.config.file={config}") as target:
        end = during(flood, workers=64)
        try:
            time.sleep(1.5)
            # Prometheus from another address, logging in for the first time.
            first = scrape(target, headers=valid, source_address="127.0.0.2")
        finally:
            end()
        rejected = "kvcap_web_requests_rejected_total"
        refused = target.counter(rejected, headers=valid, reason="unauthorized")
        busy = target.counter(rejected, headers=valid, reason="auth_busy")
    print(
        f"64 bad-password clients: first valid login {first.elapsed_s:.3f} s; "
        f"{refused:.0f} refused after bcrypt, {busy:.0f} without"
    )
    assert first.status == 200
    assert first.elapsed_s < SCRAPE_WITHIN_S
    assert refused + busy >= 64


def test_sighup_reloads_the_web_config_and_never_kills(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4)).decode()
    config = tmp_path / "web.yml"
    config.write_text(f"basic_auth_users:\n  alice: '{hashed}'\n")
    socket_path = tmp_path / "handshake" / "kvcap.sock"
    bob = {"Authorization": "Basic " + base64.b64encode(b"bob:right").decode()}
    with daemon(
        f"--web.config.file={config}",
        "--collector.handshake",
        f"--handshake.listen=ipc://{socket_path}",
    ) as target:
        assert socket_path.is_socket()
        # No request comes in before the reload is logged: the signal made the daemon look.
        config.write_text(f"basic_auth_users:\n  bob:   '{hashed}'\n")
        target.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while not target.logged("web_config_reloaded") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert target.logged("reloading")
        assert scrape(target, headers=bob).status == 200
        target.process.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        assert target.process.poll() is None
        target.process.send_signal(signal.SIGTERM)
        assert target.process.wait(5) == 0
    assert not socket_path.exists()
