"""Prefix-cache residency from a live vLLM's KV events, through kvcap sidecars.

A tiny Llama on vLLM 0.32.0 with KV events on (`tcp://*:PORT`, the publisher binds only
with a wildcard) and a replay endpoint, a pool of 40 blocks of 32 tokens, and prompts
of token ids sharing a 64-token prefix: kvcap's resident blocks must be the distinct full
blocks of the prompts (computed here) until the pool is full; after that stored - removed
= resident at every scrape and lifetimes are observed. A sidecar restarted mid-stream
replays what it missed (or, without the replay endpoint, says approximate); a restarted
vLLM starts the residency from zero. A Gemma 3 (sliding window 64) shows one residency
per KV cache group.
"""

from __future__ import annotations

import json
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from tests.kv_events_data import distinct_full_blocks
from tests.support import Scrape
from tools.live.models import VOCAB_SIZE, write_model
from tools.live.server import VllmServer
from tools.live.sidecar import Sidecar, wait_for
from tools.live.vllm_install import vllm_python

RELEASE = "0.32.0"
BLOCK_SIZE = 32
POOL_BLOCKS = 40
PREFIX_TOKENS = 64  # two shared blocks
SUFFIX_TOKENS = 68  # two blocks of each prompt's own, and 4 tokens that fill no block
RESIDENT = "kvcap_prefix_cache_resident_blocks"


def prompt(index: int, suffix_tokens: int = SUFFIX_TOKENS) -> list[int]:
    prefix = [3 + (i * 7) % (VOCAB_SIZE - 3) for i in range(PREFIX_TOKENS)]
    return prefix + [3 + (index * 131 + i * 17) % (VOCAB_SIZE - 3) for i in range(suffix_tokens)]


@dataclass
class KvEventsServer:
    server: VllmServer
    events_port: int
    replay_port: int
    workdir: Path


def publisher_port() -> int:
    """A free port below the ephemeral range. vLLM binds its publisher a minute after it
    starts; an ephemeral port (free_port's) is likely taken by then by one of the many
    connections the sidecars open meanwhile ("Address already in use")."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12_000), low - 1)
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")


def kv_events_server(
    workdir: Path,
    model: str,
    *,
    port: int | None = None,
    ports: tuple[int, int] | None = None,
    **overrides: object,
) -> KvEventsServer:
    events_port, replay_port = ports or (publisher_port(), publisher_port())
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
    }
    server = VllmServer(
        vllm_python(RELEASE),
        write_model(workdir, model, **overrides),
        workdir,
        port=port,
        max_model_len=512,
        args=[
            "--block-size",
            str(BLOCK_SIZE),
            "--num-gpu-blocks-override",
            str(POOL_BLOCKS if model == "llama" else 2 * POOL_BLOCKS),
            "--kv-events-config",
            json.dumps(config),
        ],
    )
    return KvEventsServer(server, events_port, replay_port, workdir)


def sidecar_for(live: KvEventsServer, *extra: str) -> Sidecar:
    return Sidecar(
        live.workdir,
        [
            "--no-collector.handshake",
            f"--vllm.url={live.server.url}",
            "--vllm.poll-interval=0.5",
            *extra,
        ],
    )


def pools(scrape: Scrape, name: str = RESIDENT) -> dict[tuple[str, str, str], float]:
    return {
        (labels["engine"], labels["group"], labels["medium"]): value
        for labels, value in scrape.samples.get(name, [])
    }


def one(scrape: Scrape, name: str) -> float | None:
    """The value of the one pool's `name`; None while it is not exported."""
    values = list(pools(scrape, name).values())
    assert len(values) <= 1, values
    return values[0] if values else None


def the(scrape: Scrape, name: str) -> float:
    """The value of the one pool's `name`, which must be exported."""
    value = one(scrape, name)
    assert value is not None, f"{name} is not exported"
    return value


def connected(sidecar: Sidecar) -> bool:
    return sidecar.scrape().by_engine("kvcap_kv_events_up") == {"0": 1}


def send(server: VllmServer, indices: range) -> list[list[int]]:
    prompts = [prompt(i) for i in indices]
    for tokens in prompts:
        server.complete(tokens, max_tokens=1)
    return prompts


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KvEventsServer, Sidecar]]:
    live = kv_events_server(tmp_path_factory.mktemp("live-kv-events"), "llama")
    sidecar = sidecar_for(live)
    sidecar.start()
    live.server.start()
    try:
        wait_for(
            lambda: connected(sidecar),
            30,
            "kvcap connected to vLLM's publisher",
            sidecar.tail,
        )
        yield live, sidecar
    finally:
        live.server.stop()
        sidecar.stop()


def test_resident_blocks_are_the_distinct_full_blocks_stored(
    llama: tuple[KvEventsServer, Sidecar],
) -> None:
    live, sidecar = llama
    prompts = send(live.server, range(12))
    expected = distinct_full_blocks(prompts, BLOCK_SIZE)
    assert expected == 26 < POOL_BLOCKS
    wait_for(
        lambda: pools(sidecar.scrape()).get(("0", "0", "GPU")) == expected,
        20,
        f"{expected} resident blocks",
        sidecar.tail,
    )
    scrape = sidecar.scrape()
    assert one(scrape, "kvcap_prefix_cache_resident_tokens") == expected * BLOCK_SIZE
    assert one(scrape, "kvcap_prefix_cache_stored_blocks_total") == expected
    assert one(scrape, "kvcap_prefix_cache_removed_blocks_total") == 0
    assert scrape.by_engine("kvcap_prefix_cache_approximate") == {"0": 0}
    # The pool size comes from vLLM's cache_config_info, through the vllm_http collector.
    wait_for(
        lambda: (
            one(sidecar.scrape(), "kvcap_prefix_cache_resident_ratio") == expected / POOL_BLOCKS
        ),
        10,
        "the resident ratio",
        lambda: f"{sidecar.scrape().by_engine('kvcap_kv_cache_blocks')}\n{sidecar.tail()}",
    )
    (engine,) = sidecar.engines()
    (group,) = engine["prefix_cache"]["groups"]
    assert (group["kind"], group["resident_blocks"]) == ("full_attention", expected)


def test_under_eviction_stored_minus_removed_is_resident_at_every_scrape(
    llama: tuple[KvEventsServer, Sidecar],
) -> None:
    live, sidecar = llama
    seen = []
    for index in range(100, 130):
        live.server.complete(prompt(index), max_tokens=1)
        scrape = sidecar.scrape()
        resident, stored, removed = (
            the(scrape, RESIDENT),
            the(scrape, "kvcap_prefix_cache_stored_blocks_total"),
            the(scrape, "kvcap_prefix_cache_removed_blocks_total"),
        )
        seen.append((resident, stored, removed))
        assert resident == stored - removed
        assert resident <= POOL_BLOCKS - 1  # block 0 is vLLM's null block

    # The 30 prompts' own full blocks (60) outgrow the pool (39), so vLLM evicted; its events
    # reach the sidecar a little after each completion (seconds on a loaded machine).
    def after_an_eviction() -> Scrape | None:
        scrape = sidecar.scrape()
        return scrape if the(scrape, "kvcap_prefix_cache_removed_blocks_total") > 0 else None

    scrape = wait_for(
        after_an_eviction,
        30,
        "evictions (BlockRemoved) once the pool is full",
        lambda: f"(resident, stored, removed) at each scrape: {seen}\n{sidecar.tail()}",
    )
    stored, removed = (
        the(scrape, "kvcap_prefix_cache_stored_blocks_total"),
        the(scrape, "kvcap_prefix_cache_removed_blocks_total"),
    )
    assert the(scrape, RESIDENT) == stored - removed
    lifetimes = scrape.value("kvcap_prefix_cache_block_lifetime_seconds_count", engine="0")
    assert lifetimes is not None
    assert lifetimes > 0
    assert scrape.by_engine("kvcap_prefix_cache_approximate") == {"0": 0}


def test_a_sidecar_restarted_mid_stream_recovers(llama: tuple[KvEventsServer, Sidecar]) -> None:
    live, sidecar = llama
    send(live.server, range(200, 205))
    with_replay = sidecar_for(live)
    without_replay = Sidecar(
        live.workdir,
        [
            "--no-collector.handshake",
            "--no-collector.vllm_http",
            f"--kv-events.endpoint=0=tcp://127.0.0.1:{live.events_port}",
        ],
    )
    with with_replay, without_replay:
        for late in (with_replay, without_replay):
            wait_for(partial(connected, late), 30, "the late sidecar connected", late.tail)
        send(live.server, range(205, 208))
        # The replay gives the late sidecar the whole stream: it agrees with the first.
        wait_for(
            lambda: pools(with_replay.scrape()) == pools(sidecar.scrape()),
            20,
            "the same residency as the sidecar that saw it all",
            with_replay.tail,
        )
        assert with_replay.scrape().by_engine("kvcap_prefix_cache_approximate") == {"0": 0}
        wait_for(
            lambda: without_replay.scrape().value(
                "kvcap_kv_events_dropped_total", engine="0", reason="missed"
            ),
            20,
            "missed batches counted",
            without_replay.tail,
        )
        assert without_replay.scrape().by_engine("kvcap_prefix_cache_approximate") == {"0": 1}
        (document,) = json.loads(without_replay._get("/engines") or b"{}")["prefix_cache_only"]
        assert document["prefix_cache"]["approximate_reason"] == "joined the stream after its start"


def test_a_restarted_vllm_starts_the_residency_from_zero(
    llama: tuple[KvEventsServer, Sidecar],
) -> None:
    live, sidecar = llama
    assert the(sidecar.scrape(), RESIDENT) > 0
    live.server.stop()
    wait_for(
        lambda: sidecar.scrape().by_engine("kvcap_kv_events_up") == {"0": 0},
        20,
        "the publisher gone",
        sidecar.tail,
    )
    live.server.start()  # the same ports: the sidecar reconnects by itself
    prompts = send(live.server, range(300, 302))
    expected = distinct_full_blocks(prompts, BLOCK_SIZE)
    wait_for(
        lambda: pools(sidecar.scrape()).get(("0", "0", "GPU")) == expected,
        30,
        f"{expected} resident blocks of the new instance",
        sidecar.tail,
    )
    scrape = sidecar.scrape()
    cleared = scrape.value("kvcap_prefix_cache_cleared_total", engine="0")
    assert cleared is not None
    assert cleared >= 1
    assert scrape.by_engine("kvcap_prefix_cache_approximate") == {"0": 0}


def test_a_sliding_window_hybrid_has_a_residency_per_group(
    tmp_path: Path,
    llama: tuple[KvEventsServer, Sidecar],
) -> None:
    llama[0].server.stop()  # one live server at a time
    # One sliding-window layer (window 64) and one full-attention layer: two KV cache groups.
    live = kv_events_server(
        tmp_path, "gemma3", sliding_window=64, num_hidden_layers=2, sliding_window_pattern=2
    )
    with sidecar_for(live) as sidecar:
        live.server.start()
        try:
            wait_for(partial(connected, sidecar), 30, "kvcap connected", sidecar.tail)
            prompts = send(live.server, range(8))
            full_blocks = distinct_full_blocks(prompts, BLOCK_SIZE)

            def groups() -> dict[str, float]:
                scrape = sidecar.scrape()
                return {g: v for (_, g, _), v in pools(scrape).items()}

            wait_for(
                lambda: groups().get("1") == full_blocks,
                30,
                f"{full_blocks} resident blocks in the full-attention group",
                sidecar.tail,
            )
            (engine,) = sidecar.engines()
            kinds = {g["group"]: g["kind"] for g in engine["prefix_cache"]["groups"]}
            assert kinds == {0: "sliding_window", 1: "full_attention"}
            # The sliding-window group stores only the blocks it keeps (at most as many).
            assert 0 < groups()["0"] <= full_blocks
        finally:
            live.server.stop()
