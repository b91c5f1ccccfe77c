"""Properties that hold for every model and setting, checked on generated inputs."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from exporter.capacity import CapacityResult, EngineSettings, derive_capacity
from exporter.errors import CapacityError
from tests.conftest import load_golden_cases

# One config per model family of the golden file.
CONFIGS: dict[str, dict[str, Any]] = {}
for _case in load_golden_cases():
    CONFIGS.setdefault(_case["model"], _case["hf_config"])
ATTENTION_ONLY = [
    name
    for name, config in CONFIGS.items()
    if config["architectures"][0]
    not in {"JambaForCausalLM", "NemotronHForCausalLM", "Qwen3NextForCausalLM"}
    and "kv_lora_rank" not in config
]

GIB = 2**30


@st.composite
def engine_settings(draw: st.DrawFn) -> EngineSettings:
    return EngineSettings(
        tensor_parallel_size=draw(st.sampled_from([1, 2, 4, 8])),
        pipeline_parallel_size=draw(st.sampled_from([1, 1, 2])),
        kv_cache_dtype=draw(st.sampled_from(["auto", "fp8"])),
        block_size=draw(st.sampled_from([None, 16, 32, 64])),
        max_model_len=draw(st.sampled_from([None, 2048, 4096, 8192])),
        max_num_batched_tokens=draw(st.sampled_from([None, 2048, 8192, 16384])),
    )


def derive_or_discard(
    config: dict[str, Any], engine: EngineSettings, **memory: int
) -> CapacityResult:
    try:
        return derive_capacity(config, engine, **memory)
    except CapacityError:
        assume(False)
        raise  # unreachable: assume(False) aborts the example


COMMON = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@COMMON
@given(
    model=st.sampled_from(sorted(CONFIGS)),
    engine=engine_settings(),
    blocks=st.integers(min_value=1, max_value=500_000),
    extra=st.integers(min_value=1, max_value=100_000),
)
def test_more_blocks_never_lower_capacity(
    model: str, engine: EngineSettings, blocks: int, extra: int
) -> None:
    fewer = derive_or_discard(CONFIGS[model], engine, num_gpu_blocks=blocks)
    more = derive_capacity(CONFIGS[model], engine, num_gpu_blocks=blocks + extra)
    assert more.figures.kv_cache_size_tokens >= fewer.figures.kv_cache_size_tokens
    assert more.figures.kv_cache_max_concurrency > fewer.figures.kv_cache_max_concurrency


@COMMON
@given(
    model=st.sampled_from(sorted(CONFIGS)),
    engine=engine_settings(),
    memory=st.integers(min_value=GIB // 4, max_value=200 * GIB),
    extra=st.integers(min_value=0, max_value=50 * GIB),
)
def test_more_memory_never_lowers_capacity(
    model: str, engine: EngineSettings, memory: int, extra: int
) -> None:
    less = derive_or_discard(CONFIGS[model], engine, available_kv_bytes_per_worker=memory)
    more = derive_capacity(CONFIGS[model], engine, available_kv_bytes_per_worker=memory + extra)
    assert more.figures.num_gpu_blocks >= less.figures.num_gpu_blocks
    assert more.figures.kv_cache_size_tokens >= less.figures.kv_cache_size_tokens


@COMMON
@given(
    model=st.sampled_from(sorted(CONFIGS)),
    engine=engine_settings(),
    memory=st.integers(min_value=GIB // 4, max_value=200 * GIB),
    auto_fit=st.booleans(),
)
def test_tokens_are_concurrency_times_length(
    model: str, engine: EngineSettings, memory: int, auto_fit: bool
) -> None:
    if auto_fit:
        engine = EngineSettings(**{**_fields(engine), "max_model_len": -1})
    result = derive_or_discard(CONFIGS[model], engine, available_kv_bytes_per_worker=memory)
    figures = result.figures
    assert figures.kv_cache_size_tokens == int(
        figures.kv_cache_max_concurrency * figures.max_model_len
    )
    assert figures.kv_cache_max_concurrency == figures.num_gpu_blocks / result.blocks_per_request
    # Every worker's share of the pool fits in its memory, and the null block is spare.
    for bytes_per_block in result.capacity.bytes_per_block_per_worker:
        assert figures.num_gpu_blocks * bytes_per_block <= memory
    # vLLM starts only when one full-length request fits beside the null block.
    assert result.blocks_per_request <= figures.num_gpu_blocks - 1
    # Groups share one block pool, so they share one page size.
    assert len({group.page_size_bytes for group in result.capacity.groups}) == 1


@COMMON
@given(
    model=st.sampled_from(sorted(ATTENTION_ONLY)),
    tp=st.sampled_from([2, 4, 8]),
    kv_cache_dtype=st.sampled_from(["auto", "fp8"]),
    max_model_len=st.sampled_from([2048, 4096, 8192]),
    memory=st.integers(min_value=GIB // 8, max_value=40 * GIB),
)
def test_tensor_parallel_ranks_split_the_kv_heads(
    model: str, tp: int, kv_cache_dtype: str, max_model_len: int, memory: int
) -> None:
    """With N ranks each holding 1/N of the KV heads, N ranks of M bytes hold what one
    worker of N*M bytes would."""
    config = CONFIGS[model]
    assume(config["num_key_value_heads"] % tp == 0)
    single = derive_or_discard(
        config,
        EngineSettings(kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len),
        available_kv_bytes_per_worker=memory * tp,
    )
    split = derive_capacity(
        config,
        EngineSettings(
            tensor_parallel_size=tp, kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len
        ),
        available_kv_bytes_per_worker=memory,
    )
    assert (
        split.capacity.bytes_per_block_per_worker[0] * tp
        == single.capacity.bytes_per_block_per_worker[0]
    )
    for group in split.capacity.groups:
        assert group.page_size_bytes * tp in {g.page_size_bytes for g in single.capacity.groups}
    assert split.capacity.num_gpu_blocks == single.capacity.num_gpu_blocks
    assert split.capacity.kv_cache_size_tokens == single.capacity.kv_cache_size_tokens


def _fields(engine: EngineSettings) -> dict[str, Any]:
    return {name: getattr(engine, name) for name in EngineSettings.__dataclass_fields__}
