"""config.json and engine settings -> derive_capacity: a KvcapError or a consistent plan.

Configs are the real ones of the golden file and the fixtures, broken a little: keys
deleted, values of the wrong type, zero, negative, huge or NaN numbers, unknown
architectures, random `layer_types`, nested garbage. Whatever comes in, the capacity model
either refuses with one of kvcap's own errors or returns numbers that obey vLLM's
arithmetic; it never crashes with a Python error and never invents a number.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.capacity import (
    MAX_LAYERS,
    CapacityResult,
    EngineSettings,
    derive_capacity,
    supported_families,
)
from exporter.errors import KvcapError
from tests.conftest import FIXTURES, load_golden_cases
from tests.fuzz.mutations import HOSTILE_NUMBERS, garbage, mutated

# Every distinct config kvcap has a golden or fixture copy of.
CONFIGS: dict[str, dict[str, Any]] = {}
for _case in load_golden_cases():
    CONFIGS.setdefault(_case["model"], _case["hf_config"])
for _path in sorted((FIXTURES / "configs").glob("*.json")):
    CONFIGS.setdefault(_path.stem, json.loads(_path.read_text(encoding="utf-8")))

ARCHITECTURES = sorted({arch for archs in supported_families().values() for arch in archs})
MODEL_TYPES = sorted(
    {str(c.get("model_type")) for c in CONFIGS.values()}
    | {str(c["text_config"].get("model_type")) for c in CONFIGS.values() if "text_config" in c}
)
# Every key any of the configs has, so insertions hit fields the families read.
KEYS = tuple(
    sorted(
        {key for c in CONFIGS.values() for key in c}
        | {key for c in CONFIGS.values() for key in c.get("text_config", {})}
    )
)
LAYER_TYPES = (
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "linear_attention",
    "attention",
    "mamba",
    "conv",
    "",
)
# The model builds one record per layer: up to its bound of 100,000 layers that takes about
# a second, so the property test stays under this many to try many configs (the bound itself
# is pinned by test_a_million_layers_is_refused_quickly).
MAX_FUZZED_LAYERS = 4096
TIME_LIMIT_S = 5


def layer_count(config: dict[str, Any]) -> Any:
    text = config.get("text_config")
    source = text if isinstance(text, dict) else config
    return source.get("num_hidden_layers")


@st.composite
def layer_types(draw: st.DrawFn, config: dict[str, Any]) -> list[Any]:
    count = layer_count(config)
    length = (
        count
        if isinstance(count, int) and 0 <= count <= 256 and draw(st.booleans())
        else draw(st.integers(min_value=0, max_value=64))
    )
    kinds = st.sampled_from(LAYER_TYPES) | st.text(max_size=6) | garbage
    return draw(st.lists(kinds, min_size=length, max_size=length))


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """A golden config with a few mutations, and maybe a new architecture or layer types."""
    config = draw(st.sampled_from(sorted(CONFIGS)).map(lambda name: CONFIGS[name]))
    config = draw(mutated(config, keys=KEYS))
    if not isinstance(config, dict):
        return {"architectures": [draw(st.sampled_from(ARCHITECTURES))], "x": config}
    text_config = config.get("text_config")
    target: dict[str, Any] = text_config if isinstance(text_config, dict) else config
    if draw(st.booleans()):
        config["architectures"] = draw(
            st.one_of(
                st.sampled_from(ARCHITECTURES).map(lambda a: [a]),
                st.lists(st.text(max_size=20), max_size=2),
                garbage,
            )
        )
    if draw(st.booleans()):
        target["model_type"] = draw(st.sampled_from(MODEL_TYPES) | st.text(max_size=12))
    if draw(st.booleans()):
        target["layer_types"] = draw(layer_types(target))
    return config


def engine_settings_kwargs() -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments for EngineSettings, valid or not (EngineSettings may refuse them)."""
    sizes = st.sampled_from([1, 1, 2, 4, 8]) | st.integers(min_value=-1, max_value=64)
    optional = st.none() | st.sampled_from([0, -1, 1, 16, 64, 2048, 10**9]) | st.integers()
    dtypes = st.sampled_from(["auto", "bfloat16", "float16", "float32", "half"]) | st.text(
        max_size=10
    )
    kv_dtypes = st.sampled_from(
        ["auto", "fp8", "fp8_e5m2", "bfloat16", "int8_per_token_head", "nvfp4"]
    ) | st.text(max_size=10)
    return st.fixed_dictionaries(
        {},
        optional={
            "tensor_parallel_size": sizes,
            "pipeline_parallel_size": sizes,
            "decode_context_parallel_size": sizes,
            "dtype": dtypes,
            "kv_cache_dtype": kv_dtypes,
            "block_size": optional,
            "max_model_len": optional,
            "max_num_batched_tokens": optional,
            "num_gpu_blocks_override": optional,
            "enable_prefix_caching": st.none() | st.booleans(),
            "mamba_cache_dtype": dtypes,
            "mamba_ssm_cache_dtype": dtypes,
        },
    )


memory = st.one_of(
    st.fixed_dictionaries({"num_gpu_blocks": st.integers(min_value=-10, max_value=2**40)}),
    st.fixed_dictionaries(
        {"available_kv_bytes_per_worker": st.integers(min_value=-(2**30), max_value=2**50)}
    ),
    st.fixed_dictionaries(
        {
            "num_gpu_blocks": st.sampled_from([x for x in HOSTILE_NUMBERS if isinstance(x, int)]),
        }
    ),
)


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    """Turn a hang into a failure (pytest runs tests on the main thread).

    Best effort: a signal that lands in one of hypothesis' gc callbacks is reported as an
    unraisable exception after the call returns, which still fails the test.
    """

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"derive_capacity ran longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def derive(config: Any, kwargs: dict[str, Any], memory: dict[str, int]) -> CapacityResult | None:
    """The result, or None when kvcap refused with one of its own errors."""
    with time_limit(TIME_LIMIT_S):
        try:
            return derive_capacity(config, EngineSettings(**kwargs), **memory)
        except KvcapError:
            return None


def check_plan(result: CapacityResult, kwargs: dict[str, Any], memory: dict[str, int]) -> None:
    """vLLM's arithmetic, which every plan obeys whatever the model."""
    for name in ("num_gpu_blocks", "block_size", "max_model_len", "kv_cache_size_tokens"):
        value = getattr(result.capacity, name)
        assert type(value) is int, (name, value)
    figures = result.figures
    assert isinstance(result.capacity.kv_cache_max_concurrency, float)
    assert math.isfinite(figures.kv_cache_max_concurrency)
    assert result.capacity.groups
    assert result.blocks_per_request > 0
    # The null block is held back, and one full-length request must fit.
    assert figures.num_gpu_blocks >= result.blocks_per_request + 1
    assert figures.max_model_len >= 1
    assert (result.capacity.block_size or 0) >= 1
    assert figures.kv_cache_max_concurrency == figures.num_gpu_blocks / result.blocks_per_request
    assert figures.kv_cache_size_tokens == int(
        figures.kv_cache_max_concurrency * figures.max_model_len
    )
    assert figures.kv_cache_size_tokens >= figures.max_model_len
    tp = kwargs.get("tensor_parallel_size", 1)
    pp = kwargs.get("pipeline_parallel_size", 1)
    assert len(result.capacity.bytes_per_block_per_worker) == tp * pp
    assert all(type(b) is int and b >= 0 for b in result.capacity.bytes_per_block_per_worker)
    for group in result.capacity.groups:
        assert group.block_size >= 1
        assert group.page_size_bytes >= 1
        assert group.blocks_per_request >= 1
        assert group.num_layers >= 0
    override = kwargs.get("num_gpu_blocks_override")
    if override is not None:
        assert figures.num_gpu_blocks == override
    elif "num_gpu_blocks" in memory:
        assert figures.num_gpu_blocks == memory["num_gpu_blocks"]
    else:
        available = memory["available_kv_bytes_per_worker"]
        for bytes_per_block in result.capacity.bytes_per_block_per_worker:
            assert figures.num_gpu_blocks * bytes_per_block <= available


def bounded(config: Any) -> bool:
    count = layer_count(config) if isinstance(config, dict) else None
    return not (
        isinstance(count, int | float)
        and not isinstance(count, bool)
        and math.isfinite(count)
        and count > MAX_FUZZED_LAYERS
    )


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(config=configs().filter(bounded), kwargs=engine_settings_kwargs(), memory=memory)
def test_mutated_configs_give_a_kvcap_error_or_a_consistent_plan(
    config: dict[str, Any], kwargs: dict[str, Any], memory: dict[str, int]
) -> None:
    result = derive(config, kwargs, memory)
    if result is not None:
        check_plan(result, kwargs, memory)
        # Pure: the same input gives the same plan.
        assert derive(config, kwargs, memory) == result


@given(config=garbage, kwargs=engine_settings_kwargs(), memory=memory)
def test_arbitrary_json_gives_a_kvcap_error(
    config: Any, kwargs: dict[str, Any], memory: dict[str, int]
) -> None:
    result = derive(config, kwargs, memory)
    if result is not None:
        check_plan(result, kwargs, memory)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_config_unmutated_derives_or_refuses_cleanly(name: str) -> None:
    result = derive(CONFIGS[name], {}, {"num_gpu_blocks": 100_000})
    if result is not None:
        check_plan(result, {}, {"num_gpu_blocks": 100_000})


# --- the bugs the fuzzer found, minimal inputs --------------------------------------

# The smallest configs of four families that derive_capacity plans correctly.
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hidden_size": 256,
    "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}
GEMMA3 = {
    **LLAMA,
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "head_dim": 64,
    "sliding_window": 512,
}
JAMBA = {
    **LLAMA,
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "attn_layer_period": 2,
    "attn_layer_offset": 1,
}
QWEN3_NEXT = {
    **LLAMA,
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "head_dim": 64,
}
LLAMA4 = {
    **LLAMA,
    "architectures": ["Llama4ForCausalLM"],
    "model_type": "llama4_text",
    "head_dim": 64,
}
BLOCKS = {"num_gpu_blocks": 1000}


def refused_cleanly(
    config: dict[str, Any], /, settings: EngineSettings | None = None, **changes: Any
) -> None:
    """kvcap refuses the config with one of its own errors, naming the field."""
    with pytest.raises(KvcapError) as refused:
        derive_capacity({**config, **changes}, settings or EngineSettings(), **BLOCKS)
    field = next(iter(changes))
    assert field in str(refused.value) or "config.json" in str(refused.value)


@pytest.mark.parametrize("config", [LLAMA, GEMMA3, JAMBA, QWEN3_NEXT, LLAMA4])
def test_the_minimal_configs_plan(config: dict[str, Any]) -> None:
    check_plan(derive_capacity(config, EngineSettings(), **BLOCKS), {}, BLOCKS)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        pytest.param(LLAMA, "num_key_value_heads", id="kv-heads"),
        pytest.param(LLAMA, "num_attention_heads", id="heads"),
        pytest.param(JAMBA, "num_attention_heads", id="jamba-heads"),
        pytest.param(JAMBA, "attn_layer_period", id="jamba-period"),
        pytest.param(GEMMA3, "sliding_window_pattern", id="gemma3-pattern"),
        pytest.param(QWEN3_NEXT, "full_attention_interval", id="qwen3-next-interval"),
        pytest.param(LLAMA4, "no_rope_layer_interval", id="llama4-interval"),
        # max_model_len 0: blocks per request 0, then num_blocks / 0.
        pytest.param(LLAMA, "max_position_embeddings", id="max-len"),
    ],
)
def test_zero_divisor_fields(config: dict[str, Any], field: str) -> None:
    zero: dict[str, Any] = {field: 0}
    refused_cleanly(config, **zero)


# A zero or negative head size left no worker with bytes: min() of nothing.
@pytest.mark.parametrize(
    ("config", "changes"),
    [
        pytest.param(LLAMA, {"hidden_size": 0}, id="hidden-0"),
        pytest.param(LLAMA, {"hidden_size": -256}, id="hidden-negative"),
        pytest.param(GEMMA3, {"head_dim": -64, "hidden_size": -256}, id="head-dim-negative"),
        pytest.param(GEMMA3, {"head_dim": -64}, id="head-dim-negative-alone"),
        pytest.param(GEMMA3, {"head_dim": 0}, id="head-dim-0"),
        # hidden_size // num_attention_heads == 0: the Mamba page alignment divides by it.
        pytest.param(JAMBA, {"hidden_size": 2}, id="jamba-head-size-0"),
        pytest.param(LLAMA, {"hidden_size": 2}, id="head-size-0"),
    ],
)
def test_non_positive_head_size(config: dict[str, Any], changes: dict[str, Any]) -> None:
    refused_cleanly(config, **changes)


# Python's json reads NaN and Infinity; int() of them raised ValueError / OverflowError.
@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"num_hidden_layers": math.nan}, id="layers-nan"),
        pytest.param({"num_hidden_layers": math.inf}, id="layers-inf"),
        pytest.param({"rope_scaling": {"rope_type": "linear", "factor": math.nan}}, id="rope-nan"),
        pytest.param({"rope_scaling": {"rope_type": "linear", "factor": math.inf}}, id="rope-inf"),
    ],
)
def test_non_finite_numbers(changes: dict[str, Any]) -> None:
    refused_cleanly(LLAMA, **changes)


@pytest.mark.parametrize(
    "factor",
    [
        pytest.param({}, id="dict"),
        pytest.param([2], id="list"),
        # 4096 * "2" is a string of 4096 twos, int() of it a 4096-digit length.
        pytest.param("2", id="str"),
        # True * 4096 is 4096: a boolean is not a number here.
        pytest.param(True, id="bool"),
    ],
)
def test_rope_factor_of_the_wrong_type(factor: Any) -> None:
    refused_cleanly(LLAMA, rope_scaling={"rope_type": "linear", "factor": factor})


def test_llama4_short_no_rope_layers() -> None:
    # no_rope_layers was indexed by layer without checking its length (IndexError).
    refused_cleanly(LLAMA4, no_rope_layers=[1])


@pytest.mark.parametrize(
    "changes",
    [
        {"max_position_embeddings": -4096},
        {"rope_scaling": {"rope_type": "linear", "factor": -1}},
    ],
    ids=["negative-max-len", "negative-rope-factor"],
)
def test_non_positive_max_model_len(changes: dict[str, Any]) -> None:
    # A negative length was planned: max_model_len -4096, blocks per request -256,
    # max_concurrency -3.9.
    refused_cleanly(LLAMA, **changes)


@pytest.mark.parametrize("window", [-5, -100_000])
def test_negative_sliding_window(window: int) -> None:
    # A negative window was planned: -100000 gave blocks per request -5225 and a capacity
    # of -783 tokens.
    config = {**LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    refused_cleanly(config, sliding_window=window)


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_non_finite_max_position_embeddings_is_refused(value: float) -> None:
    # A NaN or Infinity max_position_embeddings was skipped as if absent: 2048 was made up.
    refused_cleanly(LLAMA, max_position_embeddings=value)


@pytest.mark.process
def test_a_million_layers_is_refused_quickly() -> None:
    # Layers are built one Python object each: without a bound 10**6 layers took ~11 s and
    # 0.5 GB, 10**12 a MemoryError.
    # In a child process: a signal cannot interrupt this reliably (hypothesis' gc callbacks
    # swallow the exception), and a thread could not be stopped.
    code = (
        "import sys\n"
        "from exporter.capacity import EngineSettings, derive_capacity\n"
        "from exporter.errors import KvcapError\n"
        f"config = {{**{LLAMA!r}, 'num_hidden_layers': 10**6}}\n"
        "try:\n"
        "    derive_capacity(config, EngineSettings(), num_gpu_blocks=1000)\n"
        "except KvcapError:\n"
        "    sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], timeout=3, check=False)
    assert run.returncode == 0


# --- found while fixing the above: the same bugs reached through other fields --------


@pytest.mark.parametrize(
    ("config", "changes"),
    [
        # A length that rounds to 0: blocks per request 0, then num_blocks / 0.
        pytest.param(LLAMA, {"max_position_embeddings": 0.5}, id="max-len-half"),
        pytest.param(
            LLAMA, {"rope_scaling": {"rope_type": "linear", "factor": 1e-300}}, id="rope-tiny"
        ),
        # Skipped as if absent: the made-up default of 2048 was planned.
        pytest.param(LLAMA, {"max_position_embeddings": "4096"}, id="max-len-str"),
        pytest.param(LLAMA, {"max_position_embeddings": True}, id="max-len-bool"),
        # OverflowError: int too large to convert to float (length x 1.0).
        pytest.param(LLAMA, {"max_position_embeddings": 10**400}, id="max-len-huge"),
        # A 304-digit max_model_len was planned (and reported in DoesNotFit).
        pytest.param(
            LLAMA, {"rope_scaling": {"rope_type": "linear", "factor": 1e300}}, id="rope-huge"
        ),
        # Planned with a head of 10**400 // 4 elements.
        pytest.param(LLAMA, {"hidden_size": 10**400}, id="hidden-huge"),
        # One past the documented bound on layers.
        pytest.param(LLAMA, {"num_hidden_layers": MAX_LAYERS + 1}, id="layers-over-bound"),
        # No attention layer at all: planned as if Jamba were a pure Mamba model.
        pytest.param(JAMBA, {"attn_layer_offset": -1}, id="jamba-offset-negative"),
        # A conv state of d_conv - 1 = -1 rows was planned.
        pytest.param(JAMBA, {"mamba_d_conv": 0}, id="jamba-d-conv-0"),
        # ValueError: cannot convert float NaN to integer.
        pytest.param(
            CONFIGS["falcon-h1-1.5b-deep"],
            {"mamba_d_ssm": None, "mamba_expand": math.nan},
            id="falcon-h1-expand-nan",
        ),
        # A Mamba intermediate size of 0 was planned.
        pytest.param(
            CONFIGS["falcon-h1-1.5b-deep"],
            {"mamba_d_ssm": None, "mamba_expand": 1e-9},
            id="falcon-h1-expand-tiny",
        ),
        # More Mamba heads than intermediate channels: heads of 0 channels were planned.
        pytest.param(CONFIGS["zamba2-2.7b"], {"n_mamba_heads": 10**6}, id="zamba2-heads"),
        pytest.param(
            CONFIGS["granite-4.0-h-small"],
            {"mamba_n_heads": 10**6, "mamba_d_head": "auto"},
            id="granite-heads",
        ),
        # AttributeError: 'int' object has no attribute 'removeprefix'.
        pytest.param(CONFIGS["nemotron-h-8b"], {"mamba_ssm_cache_dtype": 5}, id="nemotron-dtype"),
    ],
)
def test_more_malformed_fields(config: dict[str, Any], changes: dict[str, Any]) -> None:
    refused_cleanly(config, **changes)


@pytest.mark.parametrize(
    ("config", "changes"),
    [
        # NVFP4 packs a head of 1 into 1 // 2 + 1 // 16 = 0 bytes: min() of no worker bytes.
        pytest.param(LLAMA, {"head_dim": 1}, id="dense"),
        # ... and the hybrid alignment divided by those 0 bytes.
        pytest.param(JAMBA, {"hidden_size": 4}, id="jamba"),
    ],
)
def test_a_page_of_no_bytes_is_refused(config: dict[str, Any], changes: dict[str, Any]) -> None:
    refused_cleanly(config, EngineSettings(kv_cache_dtype="nvfp4"), **changes)


def test_llama4_empty_no_rope_layers_takes_the_default() -> None:
    # Llama4TextConfig fills in the default pattern for an empty list; it was an IndexError.
    empty = derive_capacity({**LLAMA4, "no_rope_layers": []}, EngineSettings(), **BLOCKS)
    assert empty == derive_capacity(LLAMA4, EngineSettings(), **BLOCKS)


def test_llama4_attention_chunk_size_0_is_full_attention() -> None:
    # vLLM chunks a RoPE layer only when attention_chunk_size is truthy; a chunk of 0 was
    # planned as a chunked group.
    zero = derive_capacity({**LLAMA4, "attention_chunk_size": 0}, EngineSettings(), **BLOCKS)
    assert {group.kind for group in zero.capacity.groups} == {"full_attention"}
    assert all(group.attention_chunk_size is None for group in zero.capacity.groups)


@pytest.mark.parametrize("no_limit", [10**30, 1e30], ids=["int", "float"])
def test_transformers_no_limit_length_is_unbounded_not_refused(no_limit: Any) -> None:
    # transformers writes int(1e30) for "no limit"; with --max-model-len given, vLLM serves.
    config = {**LLAMA, "model_max_length": no_limit}
    result = derive_capacity(config, EngineSettings(max_model_len=2048), **BLOCKS)
    assert result == derive_capacity(LLAMA, EngineSettings(max_model_len=2048), **BLOCKS)
