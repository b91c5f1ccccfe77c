"""`vllm serve` argument strings and argv lists: VllmServeArgs or ConfigError, nothing else.

The string comes from `--vllm.args` (a traceback there is a crash at startup); the argv
list from /proc/<pid>/cmdline of any process in the pod (an exception other than a
KvcapError there escapes discover_serve_args and stops the vllm_http poller).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.collectors.parsing import VllmServeArgs, parse_vllm_serve_args, to_engine_settings
from exporter.collectors.parsing.vllm_args import _BOOLEANS, _FLAGS
from exporter.errors import ConfigError
from tests.conftest import GOLDEN

RECORDED = sorted(
    {
        json.loads(path.read_text(encoding="utf-8"))["vllm_args"]
        for path in [*GOLDEN.glob("expositions/**/*.json"), *GOLDEN.glob("handshake/*.json")]
        if "vllm_args" in json.loads(path.read_text(encoding="utf-8"))
    }
)
FLAGS = sorted(_FLAGS) + sorted(_BOOLEANS) + ["--served-model-name"]
OTHER_FLAGS = [
    "--trust-remote-code",
    "--enable-chunked-prefill",
    "--no-enable-log-requests",
    "-O3",
    "-O",
    "--port",
    "--compilation-config",
    "--headless",
    "-",
    "--",
]
LAUNCHERS = [
    ["vllm", "serve"],
    ["/usr/local/bin/vllm", "serve"],
    ["python3", "-m", "vllm.entrypoints.openai.api_server"],
    ["python3", "-m", "vllm.entrypoints.cli.main", "serve"],
    ["serve"],
    [],
]
VALUES = [
    "0",
    "1",
    "-1",
    "2",
    "8",
    "auto",
    "32k",
    "32K",
    "1.5k",
    "0.5K",
    "40GiB",
    "40GB",
    "40g",
    "1e3",
    "1_000",
    "0x10",
    " 7 ",
    "+3",
    "\u0663",  # ARABIC-INDIC DIGIT THREE: int() reads it, a regex \d matches it
    "\u00b2",  # SUPERSCRIPT TWO: str.isdigit() is true, int() refuses it
    "nan",
    "inf",
    "-inf",
    "0.92",
    "1.0000001",
    "true",
    "False",
    "fp8",
    "bfloat16",
    "",
    "=",
    "9" * 400 + "K",
    "9" * 5000,
]


def spelled(flag: str) -> st.SearchStrategy[str]:
    """`--max-model-len` as argparse users write it: also `--max_model_len`."""
    return st.sampled_from([flag, flag.replace("-", "_").replace("__", "--", 1)])


@st.composite
def argv(draw: st.DrawFn) -> list[str]:
    """A command line of known and unknown flags, with odd values attached or not."""
    tokens = list(draw(st.sampled_from(LAUNCHERS)))
    if draw(st.booleans()):
        tokens.append(draw(st.sampled_from(["/models/x", "meta-llama/Llama-3.1-8B", "-"])))
    for _ in range(draw(st.integers(min_value=0, max_value=8))):
        flag = draw(st.sampled_from(FLAGS) | st.sampled_from(OTHER_FLAGS))
        flag = draw(spelled(flag))
        value = draw(st.sampled_from(VALUES) | st.text(max_size=6))
        shape = draw(st.sampled_from(["separate", "attached", "bare"]))
        if shape == "separate":
            tokens += [flag, value]
        elif shape == "attached":
            tokens.append(f"{flag}={value}")
        else:
            tokens.append(flag)
    return tokens


def parse(args: str | list[str]) -> VllmServeArgs | None:
    """The arguments, or None when refused with a ConfigError."""
    try:
        return parse_vllm_serve_args(args)
    except ConfigError:
        return None


def check_args(args: VllmServeArgs) -> None:
    """Every field is of its type and within vLLM's bounds: nothing half-parsed."""
    for name in (
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "data_parallel_size",
        "decode_context_parallel_size",
        "block_size",
        "num_gpu_blocks_override",
        "max_num_batched_tokens",
    ):
        value = getattr(args, name)
        assert value is None or (type(value) is int and value >= 1), (name, value)
    for name in ("data_parallel_size_local", "data_parallel_start_rank", "data_parallel_rank"):
        value = getattr(args, name)
        assert value is None or (type(value) is int and value >= 0), (name, value)
    assert args.max_model_len is None or args.max_model_len == -1 or args.max_model_len >= 1
    assert args.kv_cache_memory_bytes is None or (
        type(args.kv_cache_memory_bytes) is int and args.kv_cache_memory_bytes >= 0
    )
    utilization = args.gpu_memory_utilization
    assert utilization is None or (math.isfinite(utilization) and 0 < utilization <= 1)
    assert args.enable_prefix_caching in (None, True, False)
    for name in ("kv_cache_dtype", "dtype", "mamba_cache_dtype", "mamba_ssm_cache_dtype"):
        value = getattr(args, name)
        assert value is None or (isinstance(value, str) and value)
    # Whatever was read, the capacity model takes it (or refuses it with a ConfigError).
    try:
        settings = to_engine_settings(args)
    except ConfigError:
        return
    for field in dataclasses.fields(settings):
        given = getattr(args, field.name, None)
        if given is not None:
            assert getattr(settings, field.name) == given


@given(text=st.text())
def test_arbitrary_strings(text: str) -> None:
    result = parse(text)
    if result is not None:
        check_args(result)


@given(tokens=st.lists(st.text(max_size=10), max_size=10))
def test_arbitrary_argv_lists(tokens: list[str]) -> None:
    result = parse(tokens)
    if result is not None:
        check_args(result)


@given(tokens=argv())
def test_command_lines_of_known_flags(tokens: list[str]) -> None:
    result = parse(tokens)
    if result is not None:
        check_args(result)


@given(tokens=argv())
def test_a_string_and_its_argv_say_the_same(tokens: list[str]) -> None:
    """The chart's string and /proc's argv of one command line give the same settings."""
    assert parse(shlex.join(tokens)) == parse(tokens)


@given(
    recorded=st.sampled_from(RECORDED),
    cut=st.integers(min_value=0, max_value=200),
    insert=st.text(max_size=8),
)
def test_recorded_command_lines_mutated(recorded: str, cut: int, insert: str) -> None:
    text = recorded[:cut] + insert + recorded[cut:]
    result = parse(text)
    if result is not None:
        check_args(result)


def test_recorded_command_lines_parse() -> None:
    assert RECORDED
    for text in RECORDED:
        result = parse_vllm_serve_args(text)
        check_args(result)
        assert result.model is not None


# --- the bugs the fuzzer found, minimal inputs ------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        # int() refuses more than 4,300 digits with a ValueError: refused before.
        pytest.param("--max-model-len " + "9" * 5000, id="max-model-len"),
        pytest.param("--max-num-batched-tokens " + "9" * 5000, id="max-num-batched-tokens"),
        pytest.param("--kv-cache-memory-bytes " + "9" * 5000, id="kv-cache-memory-bytes"),
        # parse_size: float() of 400 digits is inf; refused as too large.
        pytest.param("--max-model-len " + "9" * 400 + "K", id="K"),
        pytest.param("--kv-cache-memory-bytes " + "9" * 400 + "G", id="G"),
    ],
)
def test_overlong_numbers(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_vllm_serve_args(text)
