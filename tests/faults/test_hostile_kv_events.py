"""Hostile KV event publishers against a kvcap daemon in its own process (issue 25): peak
RSS under 96 MiB, every scrape and `/engines` under 1 s, the honest engine current, one
log line per cause, no traceback, SIGTERM obeyed within 2 s."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import msgspec
import pytest

from tests.collectors.test_kv_events import STREAM, events_in
from tests.collectors.test_kv_events_hostile import nested, nil_events
from tests.faults.hostile import MAX_RSS_MIB, SCRAPE_WITHIN_S, Daemon, daemon, scrape
from tests.kv_events_publisher import StandInPublisher

Attack = Callable[[StandInPublisher], None]


@dataclass
class Measured:
    peak_rss_mib: float
    slowest_s: float
    sigterm_s: float
    log: list[str]


def stores_without_end(publisher: StandInPublisher) -> None:
    """64 groups x 4 media x 30 k blocks, the pool unknown: 7.7 M block hashes."""
    sequence = 0
    for group in range(64):
        for medium in ("GPU", "CPU", "STORAGE", "DISK"):
            first = sequence * 30_000
            event = {
                "type": "BlockStored",
                "block_hashes": list(range(2**62 + first, 2**62 + first + 30_000)),
                "group_idx": group,
                "medium": medium,
            }
            publisher.publish(sequence, msgspec.msgpack.encode([1.0 + sequence, [event]]))
            sequence += 1
            time.sleep(0.002)


def repeated(payload: bytes, count: int) -> Attack:
    def attack(publisher: StandInPublisher) -> None:
        for sequence in range(count):
            publisher.publish(sequence, payload)
            time.sleep(0.002)

    return attack


def one_60_mib_batch(publisher: StandInPublisher) -> None:
    """The issue's batch: 60 MiB of 63 M nil events (was over 1.5 GiB). Past MAXMSGSIZE:
    libzmq drops the connection at its header; kvcap subscribes again after a back-off."""
    publisher.publish(0, nil_events(63_000_000))
    time.sleep(1.5)


def extreme_timestamps(publisher: StandInPublisher) -> None:
    for sequence, ts in enumerate([-1e308, 1e308] * 50):
        stored = {"type": "BlockStored", "block_hashes": [sequence]}
        removed = {"type": "BlockRemoved", "block_hashes": [sequence]}
        publisher.publish(sequence, msgspec.msgpack.encode([ts, [stored, removed]]))


@contextmanager
def watched(target: Daemon) -> Iterator[list[float]]:
    """Scrapes /metrics and /engines every 0.1 s while the attack runs: their times."""
    times: list[float] = []
    stop = threading.Event()

    def scraper() -> None:
        while not stop.is_set():
            for path in ("/metrics", "/engines"):
                reply = scrape(target, path)
                assert reply.status == 200
                times.append(reply.elapsed_s)
            stop.wait(0.1)

    thread = threading.Thread(target=scraper, daemon=True)
    thread.start()
    try:
        yield times
    finally:
        stop.set()
        thread.join(15)


def replay_flood(publisher: StandInPublisher) -> None:
    """Joined mid-stream, kvcap asks for a replay from 0: the answer is 20,000 batches of
    16 KiB (was 392 MiB: 1,000 queued per replay socket, nothing capped)."""
    hashes = list(range(2**62, 2**62 + 1_800))  # 16.2 KiB
    payload = msgspec.msgpack.encode([1.0, [{"type": "BlockStored", "block_hashes": hashes}]])
    for sequence in range(20_000):
        publisher.publish(sequence, payload, send=False)
    publisher.publish(20_000, payload)
    deadline = time.monotonic() + 10
    while not publisher.replays and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(2.5)  # the replay's deadline (2 s) passes


def attacked(
    attack: Attack, *flags: str, nofile: int | None = None, replay: bool = False
) -> Measured:
    hostile, honest = StandInPublisher(replay=replay), StandInPublisher()
    hostile_endpoint = hostile.endpoint + (f"+{hostile.replay_endpoint}" if replay else "")
    try:
        with daemon(
            f"--kv-events.endpoint=0={hostile_endpoint}",
            f"--kv-events.endpoint=1={honest.endpoint}+{honest.replay_endpoint}",
            *flags,
            nofile=nofile,
        ) as target:
            hostile.wait_for_subscriber()
            honest.wait_for_subscriber()
            with watched(target) as times:
                attack(hostile)
                for sequence, payload in enumerate(STREAM):
                    honest.publish(sequence, payload)
                deadline = time.monotonic() + 20
                while target.counter("kvcap_kv_events_received_total", engine="1") < events_in(
                    STREAM
                ):
                    assert time.monotonic() < deadline, "the honest engine fell behind"
                    time.sleep(0.1)
            assert target.counter("kvcap_prefix_cache_approximate", engine="1") == 0
            peak = target.peak_rss_mib()
            sigterm_s = target.sigterm_s(5)
            time.sleep(0.2)  # the last lines of the log
            return Measured(peak, max(times, default=0.0), sigterm_s, list(target.log))
    finally:
        hostile.close()
        honest.close()


ATTACKS: list[tuple[str, Attack, str]] = [
    ("stores-64-groups-4-media-30k", stores_without_end, "kv_events_bound_hit"),
    ("60MiB-of-63M-nil-events", one_60_mib_batch, "kv_events_resubscribed"),
    ("15MiB-of-nil-events-x5", repeated(nil_events(15_000_000), 5), "kv_events_malformed_batch"),
    ("nested-100k-x1000", repeated(nested(100_000), 1_000), "kv_events_malformed_batch"),
    ("timestamps-1e308", extreme_timestamps, "kv_events_malformed_batch"),
    ("replay-of-20k-x-16KiB", replay_flood, "kv_events_replay_timed_out"),
]


@pytest.mark.parametrize(("attack", "cause"), [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS])
def test_a_hostile_publisher_costs_bounded_memory_and_time(attack: Attack, cause: str) -> None:
    measured = attacked(attack, replay=attack is replay_flood)
    lines = [line for line in measured.log if cause in line]
    print(
        f"{cause}: peak RSS {measured.peak_rss_mib:.1f} MiB, slowest scrape "
        f"{measured.slowest_s:.3f} s, SIGTERM {measured.sigterm_s:.2f} s, "
        f"{len(lines)} log lines of the cause, {len(measured.log)} in all"
    )
    assert measured.peak_rss_mib < MAX_RSS_MIB
    assert measured.slowest_s < SCRAPE_WITHIN_S
    assert measured.sigterm_s < 2.0
    # A replay that brings its 20,000 batches within its deadline logs nothing.
    assert len(lines) == 1 or (attack is replay_flood and not lines), "".join(measured.log)
    assert not [line for line in measured.log if "Traceback" in line or "exc_info" in line]


def test_400_publishers_under_a_low_nofile_leave_descriptors_for_scrapes() -> None:
    """400 forged publishers under nofile 256 (the issue: `Too many open files` at 342
    subscriptions ended the thread): kvcap follows what the limit leaves room for,
    counts the rest, and scrapes are still accepted."""
    forged = [f"--kv-events.endpoint=tcp://127.0.0.1:{32_000 + i}" for i in range(400)]

    def nothing(_: StandInPublisher) -> None:
        time.sleep(1.5)

    measured = attacked(nothing, *forged, "--kv-events.max-subscriptions=1000", nofile=256)
    capped = [line for line in measured.log if "kv_events_too_many_subscriptions" in line]
    print(
        f"400 publishers under nofile 256: peak RSS {measured.peak_rss_mib:.1f} MiB, slowest "
        f"scrape {measured.slowest_s:.3f} s, {len(capped)} log line(s)"
    )
    assert len(capped) == 1
    assert not [line for line in measured.log if "Traceback" in line]
    assert measured.peak_rss_mib < MAX_RSS_MIB
    assert measured.slowest_s < SCRAPE_WITHIN_S
    assert measured.sigterm_s < 2.0
