"""The offload tier's arithmetic on small hand-made engines: chunks, copies, windows, tokens."""

from __future__ import annotations

import pytest

from exporter.capacity import EngineCapacity, GroupCapacity
from exporter.capacity.offload import OffloadSettings, offload_rules, plan_offload
from exporter.errors import ConfigError, UnsupportedConfiguration


def _group(kind: str, *, window: int | None = None, chunk: int | None = None) -> GroupCapacity:
    return GroupCapacity(
        kind=kind,
        spec_type=kind,
        num_layers=4,
        layer_names=(),
        block_size=16,
        page_size_bytes=1000,
        blocks_per_request=1,
        max_memory_usage_bytes_per_request=1,
        sliding_window=window,
        attention_chunk_size=chunk,
    )


def _engine(*groups: GroupCapacity, per_block: int = 4000) -> EngineCapacity:
    return EngineCapacity(
        num_gpu_blocks=1000,
        block_size=16,
        max_model_len=1024,
        groups=groups,
        bytes_per_block_per_worker=(per_block,),
    )


def test_a_chunk_is_padded_to_the_page_and_holds_every_workers_share() -> None:
    tier = plan_offload(
        _engine(_group("full_attention")),
        OffloadSettings(cpu_bytes=10 * 8192, blocks_per_chunk=1),
        world_size=2,
        tensor_parallel_size=2,
        platform="cuda",
    )
    assert tier.kv_bytes_per_chunk == 8192  # 2 x 4,000 bytes, up to 4 KiB pages
    assert tier.num_chunks == 10
    # One group, no window: both token figures are the same.
    assert tier.capacity_tokens == tier.stored_tokens == int(10 / 64 * 1024)


def test_mla_on_tp_only_keeps_one_copy_on_cuda_not_on_cpu() -> None:
    engine = _engine(_group("mla"))
    settings = OffloadSettings(cpu_bytes=1 << 20)
    kwargs = {"world_size": 2, "tensor_parallel_size": 2}
    assert plan_offload(engine, settings, platform="cuda", **kwargs).copies == 1  # type: ignore[arg-type]
    assert plan_offload(engine, settings, platform="cpu", **kwargs).copies == 2  # type: ignore[arg-type]


def test_a_hit_needs_only_the_windows_of_a_hybrid() -> None:
    tier = plan_offload(
        _engine(_group("sliding_window", window=64), _group("full_attention")),
        OffloadSettings(cpu_bytes=4096 * 6600),
        world_size=1,
        tensor_parallel_size=1,
        platform="cuda",
    )
    assert tier.num_chunks == 6600
    # A 1,024-token prefix: 64 chunks per group stored, 4 + 64 needed for a hit.
    assert tier.stored_tokens == int(6600 / 128 * 1024)
    assert tier.capacity_tokens == int(6600 / 68 * 1024)
    assert [g.window_chunks for g in tier.groups] == [4, None]
    assert [g.blocks for g in tier.groups] == [6600 * 4 // 68, 6600 * 64 // 68]


def test_chunked_local_windows_from_0_28_refused_before() -> None:
    engine = _engine(_group("chunked_local", chunk=128), _group("full_attention"))
    settings = OffloadSettings(cpu_bytes=1 << 24)
    common = {"world_size": 1, "tensor_parallel_size": 1, "platform": "cuda"}
    with pytest.raises(UnsupportedConfiguration, match="chunked local"):
        plan_offload(engine, settings, vllm_version="0.27.0", **common)  # type: ignore[arg-type]
    new = plan_offload(engine, settings, vllm_version="0.28.0", **common)  # type: ignore[arg-type]
    assert new.groups[0].window_chunks == 8
    assert new.capacity_tokens > new.stored_tokens


def test_a_chunk_in_tokens_must_be_whole_blocks() -> None:
    engine = _engine(_group("full_attention"))
    common = {"world_size": 1, "tensor_parallel_size": 1, "platform": "cuda"}
    four = plan_offload(engine, OffloadSettings(cpu_bytes=1 << 20, tokens_per_chunk=64), **common)  # type: ignore[arg-type]
    assert four.blocks_per_chunk == 4
    with pytest.raises(ConfigError, match="multiple of the GPU block size"):
        plan_offload(engine, OffloadSettings(cpu_bytes=1 << 20, tokens_per_chunk=40), **common)  # type: ignore[arg-type]


def test_a_plan_without_bytes_per_block_is_refused() -> None:
    """A pipeline-parallel engine's plan from the plugin: every chunk would be 0 bytes."""
    engine = EngineCapacity(num_gpu_blocks=1000, groups=(_group("full_attention"),))
    with pytest.raises(ConfigError, match="bytes per block"):
        plan_offload(
            engine,
            OffloadSettings(cpu_bytes=1 << 20),
            world_size=2,
            tensor_parallel_size=1,
            platform="cuda",
        )


@pytest.mark.parametrize(
    ("cpu_bytes", "blocks_per_chunk", "tokens_per_chunk"),
    [(0, None, None), (-1, None, None), (1, 0, None), (1, 2, 32)],
)
def test_settings_vllm_refuses_are_refused(
    cpu_bytes: int, blocks_per_chunk: int | None, tokens_per_chunk: int | None
) -> None:
    with pytest.raises(ConfigError):
        OffloadSettings(cpu_bytes, blocks_per_chunk, tokens_per_chunk)


def test_releases_before_the_native_tier_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"0\.27"):
        offload_rules("0.26.0")
    assert offload_rules("0.33.0").release == (0, 28, 0)
