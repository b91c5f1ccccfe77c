"""The offload tier of an engine learned through the plugin, over a real ZMQ handshake.

Each engine is an offload golden record's (tests/fixtures/golden/offload/, made by the
release's own offloading code): its ready message carries vLLM's GPU plan as the plugin
sends it (groups, blocks, bytes per block) and the offload settings the plugin reads from
the engine's config after vLLM's post-init (tests/plugin/standins.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter import vllm_plugin
from exporter.exposition import build_exposition
from exporter.handshake_wire import GroupExtra, ReadyExtras, ready_v2_message
from exporter.state import Snapshot
from tests.capacity.test_offload_golden import plan_record
from tests.collectors.test_handshake import Listener, private_endpoint
from tests.conftest import GOLDEN
from tests.plugin import standins
from tools.handshake_data import HANDSHAKE

RECORDS = {
    record["id"]: record
    for line in (GOLDEN / "offload" / "vllm-0.32.0-cuda.jsonl").read_text().splitlines()
    if line.strip() and "result" in (record := json.loads(line))
}
# A plain model with chunks of 4 blocks on TP 2; a sliding-window hybrid (a hit needs
# only the window's chunks of five of its six groups); MLA on TP 2 (one copy a chunk).
CASES = (
    "llama|tp2|offload-1.5GiB|bpc-4",
    "gemma3|tp2|offload-0.25GiB|bpc-1",
    "deepseek-v2-mla128|tp2|offload-1.5GiB|bpc-4",
)
RECORDING = HANDSHAKE / "llama-3.1-8b-dp2-tp1.engine0.msgpack"
BAD = ("handshake", "bad_offload_settings")


def ready_frames(record: dict[str, Any], **setting_changes: Any) -> list[bytes]:
    """The engine's ready v2 message, as the plugin sends it for the record's engine."""
    gpu, settings = record["result"]["gpu"], record["settings"]
    fields = msgspec.msgpack.decode(RECORDING.read_bytes())
    fields.update(
        data_parallel_rank=0,
        max_model_len=settings["max_model_len"],
        num_gpu_blocks=gpu["num_gpu_blocks"],
        block_size=gpu["groups"][0]["block_size"],
        world_size=settings["tensor_parallel_size"],
        vllm_version=record["vllm_version"],
    )
    # 0.29 and later: every KV cache tensor views one allocation (the plugin's
    # _bytes_per_block: its size over the blocks).
    (allocation,) = set(gpu["kv_cache_tensor_bytes"])
    extras = ReadyExtras(
        groups=[
            GroupExtra(
                spec_type=g["spec_type"],
                num_layers=g["num_layers"],
                block_size=g["block_size"],
                page_size_bytes=g["page_size_bytes"],
                sliding_window=g.get("sliding_window"),
            )
            for g in gpu["groups"]
        ],
        bytes_per_block_per_worker=[allocation // gpu["num_gpu_blocks"]]
        * settings["tensor_parallel_size"],
        model_name="offloaded",
        settings={
            **vllm_plugin._settings(standins.offloading_vllm_config(record)),
            **setting_changes,
        },
    )
    return ready_v2_message(msgspec.msgpack.encode(fields), 5.0, extras)


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    with Listener(private_endpoint(tmp_path)) as started:
        yield started


def offload_series(snapshot: Snapshot) -> dict[str, dict[tuple[str, ...], float]]:
    body = build_exposition(lambda: snapshot, process=False).body().content.decode()
    return {
        family.name: {
            tuple(s.labels[k] for k in ("engine", "medium", "group") if k in s.labels): s.value
            for s in family.samples
        }
        for family in text_string_to_metric_families(body)
        if family.name.startswith("kvcap_kv_offload_") and family.samples
    }


@pytest.mark.parametrize("case", CASES)
def test_the_plugins_settings_give_the_golden_tier(listener: Listener, case: str) -> None:
    record = RECORDS[case]
    listener.send(ready_frames(record))
    listener.wait_for(lambda s: len(s.engines) == 1 and s.engines[0].offload)
    snapshot = listener.store.snapshot()
    assert snapshot.errors == {}
    want = record["result"]["offload"]
    chunks, per_chunk = want["num_chunks"], want["blocks_per_chunk"]
    # The tokens and each group's blocks kvcap's model gives from the model's config.json
    # (tests/capacity/test_offload_golden.py checks it against the release's own code);
    # here they come from vLLM's plan as the plugin sent it.
    planned = plan_record(record)
    series = offload_series(snapshot)
    assert series["kvcap_kv_offload_capacity_blocks"] == {("0", "cpu"): chunks * per_chunk}
    assert series["kvcap_kv_offload_capacity_bytes"] == {
        ("0", "cpu"): chunks * want["kv_bytes_per_chunk"]
    }
    assert series["kvcap_kv_offload_capacity_tokens"] == {("0", "cpu"): planned.capacity_tokens}
    assert series["kvcap_kv_offload_blocks"] == {
        ("0", "cpu", str(g.group)): g.blocks for g in planned.groups
    }
    (tier,) = snapshot.engines[0].offload
    assert tier.source == "derived"


def test_a_full_attention_tier_holds_its_chunks_tokens() -> None:
    """One full-attention group: every chunk is a chunk of the prefix, so the tier holds
    chunks x blocks per chunk x block size tokens (4,096-token prefixes in whole chunks)."""
    record = RECORDS["llama|tp2|offload-1.5GiB|bpc-4"]
    want = record["result"]["offload"]
    tokens = want["num_chunks"] * want["blocks_per_chunk"] * 16
    assert plan_record(record).capacity_tokens == tokens == 49152 * 64


HOSTILE: dict[str, dict[str, Any]] = {
    "negative-bytes": {"kv_connector_cpu_bytes_to_use": -(2**30)},
    "nan-bytes": {"kv_connector_cpu_bytes_to_use": math.nan},
    "infinite-size": {"kv_offloading_size": math.inf},
    "negative-size": {"kv_offloading_size": -1.5},
    "size-as-text": {"kv_offloading_size": "1.5"},
    "10kB-connector": {"kv_connector": "C" * 10_000},
    # VLLM_USE_SIMPLE_KV_OFFLOAD=1: vLLM's other CPU tier, which kvcap does not model.
    "unmodelled-offloading-connector": {"kv_connector": "SimpleCPUOffloadConnector"},
    "connector-as-number": {"kv_connector": 7},
    "unknown-backend": {"kv_offloading_backend": "tape"},
    "zero-blocks-per-chunk": {"kv_connector_blocks_per_chunk": 0},
    "fractional-blocks-per-chunk": {"kv_connector_blocks_per_chunk": 2.5},
    "both-chunk-sizes": {"kv_connector_block_size": 64},
    "past-a-pebibyte": {"kv_connector_cpu_bytes_to_use": 2**62},
}


@pytest.mark.parametrize("attack", sorted(HOSTILE))
def test_a_bad_offload_setting_is_counted_and_exports_no_tier(
    listener: Listener, attack: str
) -> None:
    record = RECORDS["llama|tp2|offload-1.5GiB|bpc-4"]
    listener.send(ready_frames(record, **HOSTILE[attack]))
    listener.wait_for(lambda s: s.errors.get(BAD) == 1)
    snapshot = listener.store.snapshot()
    (view,) = snapshot.engines
    # The engine itself is known as vLLM reported it; only its tier is missing.
    assert view.capacity.num_gpu_blocks == record["result"]["gpu"]["num_gpu_blocks"]
    assert view.offload == ()
    assert offload_series(snapshot) == {}
    assert snapshot.collectors[0].up


def test_a_good_heartbeat_after_a_bad_one_brings_the_tier(listener: Listener) -> None:
    record = RECORDS["llama|tp2|offload-1.5GiB|bpc-4"]
    listener.send(ready_frames(record, kv_connector="C" * 10_000))
    listener.wait_for(lambda s: s.errors.get(BAD) == 1)
    listener.send(ready_frames(record))
    listener.wait_for(lambda s: bool(s.engines and s.engines[0].offload))
    assert listener.store.snapshot().errors == {BAD: 1}


def test_lmcache_and_an_older_plugin_give_no_tier_and_no_error(listener: Listener) -> None:
    record = RECORDS["llama|tp2|offload-1.5GiB|bpc-4"]
    lmcache = vllm_plugin._settings(standins.offloading_vllm_config(record, backend="lmcache"))
    frames = ready_frames(record, **lmcache)
    listener.send(frames)
    older = ready_frames(record)
    extras = msgspec.msgpack.decode(older[3])
    extras["settings"] = {"tensor_parallel_size": 2, "platform": "cuda"}  # before this issue
    fields = msgspec.msgpack.decode(older[1])
    fields["data_parallel_rank"] = 1
    older[1], older[3] = msgspec.msgpack.encode(fields), msgspec.msgpack.encode(extras)
    listener.send(older)
    listener.wait_for(lambda s: len(s.engines) == 2)
    snapshot = listener.store.snapshot()
    assert [view.offload for view in snapshot.engines] == [(), ()]
    assert snapshot.errors == {}


def test_without_bytes_per_block_the_configured_size_only(listener: Listener) -> None:
    """A pipeline-parallel engine's plugin sends no bytes per block: nothing to cut by."""
    record = RECORDS["llama|tp2|offload-1.5GiB|bpc-4"]
    frames = ready_frames(record)
    extras = msgspec.msgpack.decode(frames[3])
    extras["bytes_per_block_per_worker"] = []
    frames[3] = msgspec.msgpack.encode(extras)
    listener.send(frames)
    listener.wait_for(lambda s: bool(s.engines and s.engines[0].offload))
    snapshot = listener.store.snapshot()
    assert offload_series(snapshot) == {
        "kvcap_kv_offload_capacity_bytes": {("0", "cpu"): 1.5 * 2**30}
    }
    assert snapshot.engines[0].offload[0].source == "plugin"
    assert snapshot.errors == {}


def test_a_transfer_connector_without_offloading_is_no_tier_and_no_error(
    listener: Listener,
) -> None:
    """Disaggregated prefill moves KV blocks to another engine: no offload tier."""
    record = RECORDS["llama|tp2|offload-1.5GiB|bpc-4"]
    listener.send(ready_frames(record, kv_offloading_size=None, kv_connector="NixlConnector"))
    listener.wait_for(lambda s: len(s.engines) == 1)
    snapshot = listener.store.snapshot()
    assert snapshot.engines[0].offload == ()
    assert snapshot.errors == {}
