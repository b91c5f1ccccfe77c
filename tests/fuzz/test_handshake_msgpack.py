"""The handshake receiver under hostile msgpack shapes (deep nesting, huge headers, extreme
numbers, wrong types) in every frame of every topic, in-process and through real sockets.

`make test` runs a short budget, `make fuzz` (HYPOTHESIS_PROFILE=fuzz) the long one. Two
honest engines hold their indices throughout: no message of the fuzz may move them.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from structlog.testing import capture_logs

from exporter.collectors import HandshakeCollector, HandshakeReceiver, HandshakeSettings
from exporter.handshake_wire import (
    BYE_TOPIC,
    READY_V2_TOPIC,
    GroupExtra,
    ReadyExtras,
    encode,
    ready_v2_message,
)
from exporter.state import StateStore
from tests import support
from tests.conftest import fuzz_budget
from tests.fuzz.hostile_msgpack import hostile_value, spliced
from tests.fuzz.mutations import handshake_frames
from tools.handshake_data import ready_for_rank

READY = msgspec.msgpack.decode(ready_for_rank(0))
HEARTBEAT = {"interval_s": 5.0, "bye_token": "f" * 32}
GROUP = GroupExtra("MambaSpec", 4, 16, 65536, 65536)
EXTRAS = msgspec.msgpack.decode(
    encode(ReadyExtras(groups=[GROUP] * 2, bytes_per_block_per_worker=[1, 2], model_name="m"))
)
BYE = {"engine_index": 0, "instance_id": "f0", "bye_token": "f" * 32}
HONEST = (100, 101)
HONEST_TOKEN = "the-honest-engines-own-secret-32"
# Ranks the fuzz names: forged ones and the honest ones, whose messages it must not move.
RANKS = (0, 1, 2, 3, 100, 101)
# Every instance of the fuzz is live for the whole run: the clock does not move.
FROZEN = 1000.0


def unlimited(endpoint: str = "ipc://fuzz") -> HandshakeSettings:
    return HandshakeSettings(
        endpoint=endpoint, max_messages_per_s=1e9, max_messages_per_engine_per_s=1e9
    )


def hostile_messages(seed: int, count: int) -> Iterator[list[bytes]]:
    """Messages of the three topics with one frame, or fields of one frame, hostile."""
    rng = random.Random(seed)
    for _ in range(count):
        rank = rng.choice(RANKS)
        ready = READY | {"data_parallel_rank": rank, "instance_id": f"f{rng.randrange(3)}"}
        frames = [encode(ready), encode(HEARTBEAT), encode(EXTRAS)]
        kind = rng.randrange(6)
        if kind < 3:  # one of the ready, heartbeat and extras frames, fields spliced
            document = (ready, HEARTBEAT, EXTRAS)[kind]
            keys = (*document, "groups", "settings", "devices", "unknown")
            frames[kind] = spliced(document, rng, keys)
        elif kind == 3:  # a group of the extras
            group = msgspec.msgpack.decode(encode(GROUP))
            raw = spliced(group, rng, tuple(group))
            frames[2] = b"\x81" + encode("groups") + b"\x91" + raw
        elif kind == 4:  # a whole frame
            frames[rng.randrange(3)] = hostile_value(rng)
        else:
            bye = BYE | {"engine_index": rank}
            yield [BYE_TOPIC, spliced(bye, rng, tuple(bye)) if rng.randrange(2) else encode(bye)]
            continue
        yield [READY_V2_TOPIC, *frames[: rng.choice([2, 3])]]


def honest(receiver: HandshakeReceiver) -> None:
    for rank in HONEST:
        ready = ready_for_rank(rank, "honest")
        receiver.handle(ready_v2_message(ready, 5.0, None, HONEST_TOKEN))


def honest_kept(store: StateStore) -> bool:
    views = {view.engine: view for view in store.snapshot().engines}
    return all(views[str(rank)].instance_id == "honest" for rank in HONEST)


@pytest.mark.fuzz
def test_fuzz_hostile_msgpack_every_message_counted_honest_engines_kept() -> None:
    count = fuzz_budget(3_000, 100_000)
    store = StateStore()
    settings = unlimited()
    receiver = HandshakeReceiver("ipc://fuzz", store, settings, clock=lambda: FROZEN)
    began = time.monotonic()
    with capture_logs():
        honest(receiver)
        for frames in hostile_messages(seed=25, count=count):
            before = sum(store.snapshot().errors.values())
            receiver.handle(frames)
            assert sum(store.snapshot().errors.values()) - before in (0, 1)
    elapsed = time.monotonic() - began
    reasons = Counter({reason: n for (_, reason), n in store.snapshot().errors.items()})
    print(f"{count} hostile messages in {elapsed:.1f} s: {dict(reasons.most_common())}")
    assert honest_kept(store)
    assert reasons["malformed_frame"] > count // 3
    for view in store.snapshot().engines:
        assert view.engine == str(int(view.engine))
        assert len(view.capacity.groups) <= 2


@pytest.mark.fuzz
@pytest.mark.parametrize("source", ["mutated", "hostile"])
def test_fuzz_through_real_sockets_counts_as_in_process(tmp_path: Path, source: str) -> None:
    """The same messages through a real PULL socket and straight into a receiver: the same
    counts by reason, so nothing is lost or read differently on the socket."""
    count = fuzz_budget(3_000, 50_000)
    messages: Any = (
        handshake_frames(seed=2, count=count)
        if source == "mutated"
        else hostile_messages(seed=3, count=count)
    )
    endpoint = f"ipc://{tmp_path}/kvcap/handshake.sock"
    settings = unlimited(endpoint)
    zmq_cap = 4 * settings.max_frame_bytes + 1024  # the socket's ZMQ_MAXMSGSIZE
    collector = HandshakeCollector(settings, clock=lambda: FROZEN)
    store, direct = StateStore(), StateStore()
    in_process = HandshakeReceiver("ipc://x", direct, settings, clock=lambda: FROZEN)
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    collector.start(store)
    try:
        push.connect(endpoint)
        with capture_logs():
            for frames in messages:
                if max(map(len, frames)) > zmq_cap:
                    continue  # ZMQ drops the peer's connection for it (tested elsewhere)
                push.send_multipart(frames)
                in_process.handle(frames)
            # ZMQ keeps one connection's order: once the last message is in, all are.
            push.send_multipart(ready_v2_message(ready_for_rank(99, "last"), 5.0))
            support.wait_for(
                lambda: any(v.engine == "99" for v in store.snapshot().engines),
                60,
                "the last message",
            )
    finally:
        push.close(linger=0)
        context.term()
        collector.stop(2.0)
    assert store.snapshot().errors == direct.snapshot().errors
