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
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.capacity import CapacityResult, EngineSettings, derive_capacity, supported_families
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
# Above this many layers the model builds one record per layer for ~seconds (see
# test_a_million_layers_is_refused_quickly); the property test stays under it.
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
        value = getattr(result, name)
        assert type(value) is int, (name, value)
    assert isinstance(result.max_concurrency, float)
    assert math.isfinite(result.max_concurrency)
    assert result.groups
    assert result.blocks_per_request > 0
    # The null block is held back, and one full-length request must fit.
    assert result.num_gpu_blocks >= result.blocks_per_request + 1
    assert result.max_model_len >= 1
    assert result.block_size >= 1
    assert result.max_concurrency == result.num_gpu_blocks / result.blocks_per_request
    assert result.kv_cache_size_tokens == int(result.max_concurrency * result.max_model_len)
    assert result.kv_cache_size_tokens >= result.max_model_len
    tp = kwargs.get("tensor_parallel_size", 1)
    pp = kwargs.get("pipeline_parallel_size", 1)
    assert len(result.bytes_per_block_per_worker) == tp * pp
    assert all(type(b) is int and b >= 0 for b in result.bytes_per_block_per_worker)
    for group in result.groups:
        assert group.block_size >= 1
        assert group.page_size_bytes >= 1
        assert group.blocks_per_request >= 1
        assert group.num_layers >= 0
    override = kwargs.get("num_gpu_blocks_override")
    if override is not None:
        assert result.num_gpu_blocks == override
    elif "num_gpu_blocks" in memory:
        assert result.num_gpu_blocks == memory["num_gpu_blocks"]
    else:
        available = memory["available_kv_bytes_per_worker"]
        for bytes_per_block in result.bytes_per_block_per_worker:
            assert result.num_gpu_blocks * bytes_per_block <= available


def bounded(config: Any) -> bool:
    count = layer_count(config) if isinstance(config, dict) else None
    return not (
        isinstance(count, int | float)
        and not isinstance(count, bool)
        and math.isfinite(count)
        and count > MAX_FUZZED_LAYERS
    )


# Crashes the fuzzer found that are still open, by (exception, function that raised it),
# each pinned with its minimal input by an xfail test below. The property tests let these
# through and nothing else; delete an entry once its xfail test passes.
KNOWN_CRASHES: dict[tuple[type[BaseException], str], str] = {
    (ZeroDivisionError, "kv_heads_per_rank"): "test_zero_divisor_fields",
    (ZeroDivisionError, "config_head_dim"): "test_zero_divisor_fields",
    (ZeroDivisionError, "jamba"): "test_zero_divisor_fields",
    (ZeroDivisionError, "<listcomp>"): "test_zero_divisor_fields",
    (ZeroDivisionError, "llama4"): "test_zero_divisor_fields",
    (ZeroDivisionError, "derive_capacity"): "test_zero_divisor_fields",
    (ValueError, "derive_capacity"): "test_non_positive_head_size",
    (ZeroDivisionError, "cdiv"): "test_non_positive_head_size",
    (ValueError, "get_int"): "test_non_finite_numbers",
    (OverflowError, "get_int"): "test_non_finite_numbers",
    (ValueError, "derived_max_model_len"): "test_rope_factor_of_the_wrong_type",
    (OverflowError, "derived_max_model_len"): "test_rope_factor_of_the_wrong_type",
    (TypeError, "derived_max_model_len"): "test_rope_factor_of_the_wrong_type",
    (IndexError, "<genexpr>"): "test_llama4_short_no_rope_layers",
}


def known_crash(error: BaseException) -> str | None:
    """The xfail test that pins this crash, when it is one the fuzzer already found."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "/exporter/" in f.filename]
    if not frames:
        return None
    return KNOWN_CRASHES.get((type(error), frames[-1].name))


def derive_or_known(
    config: Any, kwargs: dict[str, Any], memory: dict[str, int]
) -> CapacityResult | None:
    """derive(), with the known open crashes and made-up plans counted as refusals."""
    try:
        result = derive(config, kwargs, memory)
    except Exception as error:
        if known_crash(error) is None:
            raise
        return None
    if result is not None and result.max_model_len < 1:
        return None  # test_non_positive_max_model_len
    if result is not None and any((g.sliding_window or 0) < 0 for g in result.groups):
        return None  # test_negative_sliding_window
    return result


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(config=configs().filter(bounded), kwargs=engine_settings_kwargs(), memory=memory)
def test_mutated_configs_give_a_kvcap_error_or_a_consistent_plan(
    config: dict[str, Any], kwargs: dict[str, Any], memory: dict[str, int]
) -> None:
    result = derive_or_known(config, kwargs, memory)
    if result is not None:
        check_plan(result, kwargs, memory)
        # Pure: the same input gives the same plan.
        assert derive(config, kwargs, memory) == result


@given(config=garbage, kwargs=engine_settings_kwargs(), memory=memory)
def test_arbitrary_json_gives_a_kvcap_error(
    config: Any, kwargs: dict[str, Any], memory: dict[str, int]
) -> None:
    result = derive_or_known(config, kwargs, memory)
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


def xfail(raises: type[BaseException], reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(strict=True, raises=raises, reason=reason)


def refused_cleanly(config: dict[str, Any], **changes: Any) -> None:
    """kvcap refuses the config with one of its own errors, naming the field."""
    with pytest.raises(KvcapError) as refused:
        derive_capacity({**config, **changes}, EngineSettings(), **BLOCKS)
    field = next(iter(changes))
    assert field in str(refused.value) or "config.json" in str(refused.value)


@pytest.mark.parametrize("config", [LLAMA, GEMMA3, JAMBA, QWEN3_NEXT, LLAMA4])
def test_the_minimal_configs_plan(config: dict[str, Any]) -> None:
    check_plan(derive_capacity(config, EngineSettings(), **BLOCKS), {}, BLOCKS)


ZERO_DIVISION = xfail(ZeroDivisionError, "a zero divisor in config.json is not checked")


@pytest.mark.parametrize(
    ("config", "field"),
    [
        pytest.param(LLAMA, "num_key_value_heads", marks=ZERO_DIVISION, id="kv-heads"),
        pytest.param(LLAMA, "num_attention_heads", marks=ZERO_DIVISION, id="heads"),
        pytest.param(JAMBA, "num_attention_heads", marks=ZERO_DIVISION, id="jamba-heads"),
        pytest.param(JAMBA, "attn_layer_period", marks=ZERO_DIVISION, id="jamba-period"),
        pytest.param(GEMMA3, "sliding_window_pattern", marks=ZERO_DIVISION, id="gemma3-pattern"),
        pytest.param(
            QWEN3_NEXT, "full_attention_interval", marks=ZERO_DIVISION, id="qwen3-next-interval"
        ),
        pytest.param(LLAMA4, "no_rope_layer_interval", marks=ZERO_DIVISION, id="llama4-interval"),
        # max_model_len 0: blocks per request 0, then num_blocks / 0.
        pytest.param(LLAMA, "max_position_embeddings", marks=ZERO_DIVISION, id="max-len"),
    ],
)
def test_zero_divisor_fields(config: dict[str, Any], field: str) -> None:
    refused_cleanly(config, **{field: 0})


NO_WORKER_BYTES = xfail(
    ValueError, "a zero or negative head size leaves no worker with bytes: min() of nothing"
)


@pytest.mark.parametrize(
    ("config", "changes"),
    [
        pytest.param(LLAMA, {"hidden_size": 0}, marks=NO_WORKER_BYTES, id="hidden-0"),
        pytest.param(LLAMA, {"hidden_size": -256}, marks=NO_WORKER_BYTES, id="hidden-negative"),
        pytest.param(
            GEMMA3,
            {"head_dim": -64, "hidden_size": -256},
            marks=NO_WORKER_BYTES,
            id="head-dim-negative",
        ),
        # hidden_size // num_attention_heads == 0: the Mamba page alignment divides by it.
        pytest.param(
            JAMBA,
            {"hidden_size": 2},
            marks=xfail(ZeroDivisionError, "cdiv by zero attention bytes per token"),
            id="jamba-head-size-0",
        ),
    ],
)
def test_non_positive_head_size(config: dict[str, Any], changes: dict[str, Any]) -> None:
    refused_cleanly(config, **changes)


def non_finite(raises: type[BaseException], changes: dict[str, Any], id: str) -> Any:
    reason = "Python's json reads NaN and Infinity; int() of them is not caught"
    return pytest.param(changes, marks=xfail(raises, reason), id=id)


@pytest.mark.parametrize(
    "changes",
    [
        non_finite(ValueError, {"num_hidden_layers": math.nan}, "layers-nan"),
        non_finite(OverflowError, {"num_hidden_layers": math.inf}, "layers-inf"),
        non_finite(
            ValueError, {"rope_scaling": {"rope_type": "linear", "factor": math.nan}}, "rope-nan"
        ),
        non_finite(
            OverflowError, {"rope_scaling": {"rope_type": "linear", "factor": math.inf}}, "rope-inf"
        ),
    ],
)
def test_non_finite_numbers(changes: dict[str, Any]) -> None:
    refused_cleanly(LLAMA, **changes)


@pytest.mark.parametrize(
    "factor",
    [
        pytest.param({}, marks=xfail(TypeError, "int * dict"), id="dict"),
        pytest.param([2], marks=xfail(TypeError, "int * list"), id="list"),
        # 4096 * "2" is a string of 4096 twos, int() of it a 4096-digit length.
        pytest.param("2", marks=xfail(OverflowError, "int * str repeats the string"), id="str"),
    ],
)
def test_rope_factor_of_the_wrong_type(factor: Any) -> None:
    refused_cleanly(LLAMA, rope_scaling={"rope_type": "linear", "factor": factor})


@xfail(IndexError, "no_rope_layers is indexed by layer without checking its length")
def test_llama4_short_no_rope_layers() -> None:
    refused_cleanly(LLAMA4, no_rope_layers=[1])


@pytest.mark.parametrize(
    "changes",
    [
        {"max_position_embeddings": -4096},
        {"rope_scaling": {"rope_type": "linear", "factor": -1}},
    ],
    ids=["negative-max-len", "negative-rope-factor"],
)
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="a negative length is planned: max_model_len -4096, blocks per request -256, "
    "max_concurrency -3.9",
)
def test_non_positive_max_model_len(changes: dict[str, Any]) -> None:
    try:
        result = derive_capacity({**LLAMA, **changes}, EngineSettings(), **BLOCKS)
    except KvcapError:
        return
    check_plan(result, {}, BLOCKS)


@pytest.mark.parametrize("window", [-5, -100_000])
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="a negative sliding_window is planned as a window: -100000 gives blocks per "
    "request -5225 and capacity -783 tokens",
)
def test_negative_sliding_window(window: int) -> None:
    config = {**LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    try:
        result = derive_capacity({**config, "sliding_window": window}, EngineSettings(), **BLOCKS)
    except KvcapError:
        return
    raise AssertionError(f"planned {result.kv_cache_size_tokens} tokens for window {window}")


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="a NaN or Infinity max_position_embeddings is skipped as if absent: 2048 is made up",
)
def test_non_finite_max_position_embeddings_is_refused(value: float) -> None:
    try:
        result = derive_capacity(
            {**LLAMA, "max_position_embeddings": value}, EngineSettings(), **BLOCKS
        )
    except KvcapError:
        return
    raise AssertionError(f"planned max_model_len {result.max_model_len} for {value}")


@xfail(
    subprocess.TimeoutExpired,
    "layers are built one Python object each, with no bound: 10**6 layers take ~11 s and "
    "0.5 GB, 10**12 a MemoryError",
)
def test_a_million_layers_is_refused_quickly() -> None:
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
