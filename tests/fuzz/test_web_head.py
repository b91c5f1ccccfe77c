"""Fuzzing the HTTP head reader and parser: any bytes end in a head or a BadHead, in bounded memory.

Two runs: hypothesis over generated heads (the profile's budget), and a seeded mutation run
of real scraper heads through a real socket pair, KVCAP_FUZZ_CASES cases (2,000 in `make
test`; docs/reliability.md reports a 100,000-case run).
"""

from __future__ import annotations

import contextlib
import os
import random
import socket

from hypothesis import given
from hypothesis import strategies as st

from exporter.web import MAX_HEAD_BYTES, BadHead, HeadReader, HeadTimeout, parse_head

CASES = int(os.environ.get("KVCAP_FUZZ_CASES", "2000"))
# What real scrapers send: Prometheus, curl, a browser, and http.client with a body.
REAL_HEADS = (
    b"GET /metrics HTTP/1.1\r\nHost: 10.0.0.7:9470\r\nUser-Agent: Prometheus/2.53.0\r\n"
    b"Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n"
    b"Accept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n",
    b"GET /engines HTTP/1.1\r\nHost: localhost:9470\r\nUser-Agent: curl/8.5.0\r\n"
    b"Accept: */*\r\n\r\n",
    b"HEAD / HTTP/1.0\r\nConnection: keep-alive\r\n"
    b"Authorization: Basic YWxpY2U6d29uZGVybGFuZA==\r\n\r\n",
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
)
PIECES = (
    b"\r\n",
    b"\n",
    b"\r",
    b"\x00",
    b":",
    b" ",
    b"\t",
    b"Content-Length: ",
    b"Transfer-Encoding: chunked\r\n",
    b"Host: ",
    b"HTTP/1.1",
    b"HTTP/9.9",
    b"HTTP/1.1000",
    b"1_0",
    b"+10",
    b"\xff",
    b"a" * 70000,
)


def check(head: bytes) -> None:
    try:
        parsed = parse_head(head)
    except BadHead as refused:
        status = refused.status
        assert status in (400, 414, 431, 505)
        return
    assert parsed.method
    assert parsed.target.startswith("/")
    assert parsed.version in ("HTTP/1.0", "HTTP/1.1")
    assert 0 <= parsed.content_length < 10**15
    assert all(name == name.lower() and "\x00" not in value for name, value in parsed.headers)


@given(st.binary(max_size=512))
def test_any_bytes_parse_or_are_refused(data: bytes) -> None:
    check(data + b"\r\n\r\n")
    check(data)


@given(
    st.sampled_from(REAL_HEADS),
    st.lists(st.tuples(st.integers(0, 400), st.sampled_from(PIECES)), max_size=4),
)
def test_real_heads_with_hostile_pieces(head: bytes, edits: list[tuple[int, bytes]]) -> None:
    for position, piece in edits:
        head = head[:position] + piece + head[position:]
    check(head)


def mutate(rng: random.Random, head: bytes) -> bytes:
    data = bytearray(head)
    for _ in range(rng.randint(1, 4)):
        choice = rng.random()
        position = rng.randint(0, len(data))
        if choice < 0.3 and data:
            data[min(position, len(data) - 1)] = rng.randint(0, 255)
        elif choice < 0.6:
            data[position:position] = rng.choice(PIECES)
        elif choice < 0.8:
            del data[position : position + rng.randint(1, 8)]
        else:
            data[position:position] = data[: rng.randint(0, len(data))]  # repeat a prefix
    return bytes(data)


def test_mutated_heads_through_a_socket_stay_within_the_budget() -> None:
    rng = random.Random(13)
    server, client = socket.socketpair()
    client.setblocking(False)
    outcomes = {"head": 0, "refused": 0, "timeout": 0, "closed": 0}
    largest_buffer = 0
    try:
        reader = HeadReader(server, lambda: None)
        for _ in range(CASES):
            data = mutate(rng, rng.choice(REAL_HEADS))
            # More than the socket buffer holds: the reader sees the part that fits.
            with contextlib.suppress(BlockingIOError):
                client.send(data)
            try:
                raw = reader.read_head(0.0001, 0.0001)
            except BadHead:
                outcomes["refused"] += 1
                reader = HeadReader(server, lambda: None)  # the server closes such connections
            except HeadTimeout:
                outcomes["timeout"] += 1
                reader = HeadReader(server, lambda: None)
            else:
                if raw is None:
                    outcomes["closed"] += 1
                else:
                    outcomes["head"] += 1
                    check(raw)
            largest_buffer = max(largest_buffer, len(reader._buffer))
            _drain(server)
    finally:
        server.close()
        client.close()
    print(f"{CASES} mutated heads: {outcomes}, largest buffer {largest_buffer} bytes")
    assert sum(outcomes.values()) == CASES
    assert largest_buffer <= MAX_HEAD_BYTES + 4
    assert outcomes["head"] > 0
    assert outcomes["refused"] > 0


def _drain(sock: socket.socket) -> None:
    sock.setblocking(False)
    try:
        while sock.recv(1 << 20):
            pass
    except BlockingIOError:
        pass
    finally:
        sock.setblocking(True)
