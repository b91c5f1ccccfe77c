"""`vllm serve` command lines: the chart's argument string, /proc cmdlines, flag spellings."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.capacity import EngineSettings
from exporter.collectors.parsing import (
    VllmServeArgs,
    parse_vllm_serve_args,
    to_engine_settings,
    vllm_args,
)
from exporter.errors import ConfigError, UsageError
from tests.conftest import GOLDEN

DEPLOYMENTS = sorted(
    path
    for path in [
        *GOLDEN.glob("expositions/*.json"),
        *GOLDEN.glob("expositions/releases/*/*.json"),
        *GOLDEN.glob("handshake/*.json"),
    ]
)


@pytest.mark.parametrize("path", DEPLOYMENTS, ids=lambda path: str(path.relative_to(GOLDEN)))
def test_fixture_args_give_their_settings(path: Path) -> None:
    expected: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    args = parse_vllm_serve_args(expected["vllm_args"])
    assert args.served_model_name == expected["served_model_name"]
    assert args.model == f"/models/{expected['model']}"
    if "v1_models" in expected:
        assert args.model == expected["v1_models"]["data"][0]["root"]
        assert args.model_name == expected["v1_models"]["data"][0]["id"]
    engine = to_engine_settings(args)
    settings_ = expected["settings"]
    assert (args.data_parallel_size or 1) == settings_["data_parallel_size"]
    for name in (
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "max_model_len",
        "kv_cache_dtype",
        "block_size",
        "max_num_batched_tokens",
        "num_gpu_blocks_override",
    ):
        assert getattr(engine, name) == settings_[name], name


def test_nothing_given() -> None:
    assert parse_vllm_serve_args("") == VllmServeArgs()
    assert parse_vllm_serve_args([]) == VllmServeArgs()
    assert to_engine_settings(VllmServeArgs()) == EngineSettings()


FLAGS = "--served-model-name x-served -tp 2 -dp 4 --max-model-len 32k"
ARGS = f"/models/x {FLAGS}"
API_SERVER = "python3 -m vllm.entrypoints.openai.api_server"
EXPECTED = VllmServeArgs(
    model="/models/x",
    served_model_name="x-served",
    tensor_parallel_size=2,
    data_parallel_size=4,
    max_model_len=32000,
)


@pytest.mark.parametrize(
    "command",
    [
        ARGS,
        f"serve {ARGS}",
        f"vllm serve {ARGS}",
        shlex.split(f"vllm serve {ARGS}"),
        shlex.split(f"/usr/bin/python3 /usr/local/bin/vllm serve {ARGS}"),
        shlex.split(f"python3 -m vllm.entrypoints.cli.main serve {ARGS}"),
        shlex.split(f"{API_SERVER} {FLAGS} --model /models/x"),
        shlex.split(f"{API_SERVER} --model=/models/x {FLAGS}"),
    ],
    ids=["chart string", "serve", "vllm serve", "argv", "python vllm", "cli module", "api", "api="],
)
def test_launchers(command: str | list[str]) -> None:
    assert parse_vllm_serve_args(command) == EXPECTED


def test_spellings() -> None:
    args = parse_vllm_serve_args(
        "/m --tensor_parallel_size=2 --pipeline-parallel-size 3 -dcp=2 --max_model_len=4096 "
        "--data-parallel-size-local 2 -dpr 4 -dpn 5 --block-size=32 --kv-cache-dtype fp8 "
        "--dtype=bfloat16 --max-num-batched-tokens 16K --num-gpu-blocks-override 1000 "
        "--gpu-memory-utilization=0.85 --mamba-cache-dtype float32 "
        "--mamba_ssm_cache_dtype float16 --kv-cache-memory-bytes 8GiB"
    )
    assert args == VllmServeArgs(
        model="/m",
        tensor_parallel_size=2,
        pipeline_parallel_size=3,
        decode_context_parallel_size=2,
        max_model_len=4096,
        data_parallel_size_local=2,
        data_parallel_start_rank=4,
        data_parallel_rank=5,
        block_size=32,
        kv_cache_dtype="fp8",
        dtype="bfloat16",
        max_num_batched_tokens=16384,
        num_gpu_blocks_override=1000,
        gpu_memory_utilization=0.85,
        mamba_cache_dtype="float32",
        mamba_ssm_cache_dtype="float16",
        kv_cache_memory_bytes=8 * 2**30,
    )
    assert to_engine_settings(args) == EngineSettings(
        tensor_parallel_size=2,
        pipeline_parallel_size=3,
        decode_context_parallel_size=2,
        dtype="bfloat16",
        kv_cache_dtype="fp8",
        block_size=32,
        max_model_len=4096,
        max_num_batched_tokens=16384,
        num_gpu_blocks_override=1000,
        mamba_cache_dtype="float32",
        mamba_ssm_cache_dtype="float16",
    )


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("32768", 32768), ("32k", 32000), ("32K", 32768), ("-1", -1), ("auto", -1), ("1m", 10**6)],
)
def test_max_model_len(text: str, tokens: int) -> None:
    assert parse_vllm_serve_args(f"/m --max-model-len {text}").max_model_len == tokens
    assert parse_vllm_serve_args(f"/m --max-model-len={text}").max_model_len == tokens


@pytest.mark.parametrize(
    ("flags", "enabled"),
    [
        ("", None),
        ("--enable-prefix-caching", True),
        ("--no-enable-prefix-caching", False),
        ("--enable_prefix_caching", True),
        ("--no-enable-prefix-caching --enable-prefix-caching", True),
        ("--enable-prefix-caching --no-enable-prefix-caching", False),
        ("--enable-prefix-caching False", False),
        ("--enable-prefix-caching=true", True),
        ("--enable-prefix-caching=False", False),
    ],
)
def test_prefix_caching(flags: str, enabled: bool | None) -> None:
    args = parse_vllm_serve_args(f"/m {flags} -tp 2")
    assert args.enable_prefix_caching is enabled
    assert args.tensor_parallel_size == 2
    assert args.model == "/m"


def test_repeated_flags_last_wins() -> None:
    args = parse_vllm_serve_args("/m -tp 2 --tensor-parallel-size 4 --tensor_parallel_size=8")
    assert args.tensor_parallel_size == 8


def test_shell_quoting() -> None:
    args = parse_vllm_serve_args(
        "'/models/my model' --served-model-name \"My Model\" other-name "
        '--kv-transfer-config \'{"kv_connector": "X", "kv_role": "kv_both"}\' -tp 2'
    )
    assert args.model == "/models/my model"
    assert args.served_model_name == "My Model"
    assert args.tensor_parallel_size == 2


SWITCHES = [
    "--trust-remote-code",
    "--enforce-eager",
    "--headless",
    "--enable-chunked-prefill",
    "--no-enable-log-requests",
    "--disable-log-stats",
    "-O3",
]
VALUED = [
    "--port 8000",
    "--host=0.0.0.0",
    "-q awq",
    "--compilation-config.level 3",
    "--override-generation-config '{\"temperature\": 0.5}'",
    "--api-server-count 2",
    "--middleware",
]


@pytest.mark.parametrize("unknown", SWITCHES)
def test_unknown_switches_leave_the_model_positional(unknown: str) -> None:
    args = parse_vllm_serve_args(f"{unknown} /models/x -tp 2")
    assert args == VllmServeArgs(model="/models/x", tensor_parallel_size=2)


@pytest.mark.parametrize("unknown", SWITCHES + VALUED)
def test_unknown_flags_are_skipped(unknown: str) -> None:
    for command in (
        f"/models/x {unknown} -tp 2 --max-model-len 4096",
        f"/models/x -tp 2 {unknown} --max-model-len 4096",
        f"/models/x -tp 2 --max-model-len 4096 {unknown}",
    ):
        assert parse_vllm_serve_args(command) == VllmServeArgs(
            model="/models/x", tensor_parallel_size=2, max_model_len=4096
        ), command


def test_the_flags_that_turn_the_hybrid_kv_cache_manager_off_are_read() -> None:
    args = parse_vllm_serve_args(
        "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1 OTHER=x vllm serve /m "
        "--kv-events-config '{\"enable_kv_cache_events\": true}' --disable-hybrid-kv-cache-manager"
    )
    assert args == VllmServeArgs(
        model="/m",
        kv_events=True,
        disable_hybrid_kv_cache_manager=True,
        chunked_local_attn_with_hybrid_kv_cache=True,
    )
    settings = to_engine_settings(args)
    assert (settings.kv_events, settings.disable_hybrid_kv_cache_manager) == (True, True)
    assert settings.chunked_local_attn_with_hybrid_kv_cache is True
    off = parse_vllm_serve_args(
        "VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0 /m "
        "--no-disable-hybrid-kv-cache-manager"
    )
    assert off.chunked_local_attn_with_hybrid_kv_cache is False
    assert off.disable_hybrid_kv_cache_manager is False
    with pytest.raises(UsageError, match="JSON object"):
        parse_vllm_serve_args("/m --kv-events-config 12")
    with pytest.raises(UsageError, match="must be an integer"):
        parse_vllm_serve_args("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=yes /m")


def test_an_unknown_switch_takes_a_boolean_literal() -> None:
    args = parse_vllm_serve_args("--model /models/x --enable-chunked-prefill False -tp 2")
    assert args == VllmServeArgs(model="/models/x", tensor_parallel_size=2)


def test_an_unknown_flag_never_swallows_a_known_flag() -> None:
    args = parse_vllm_serve_args("/m --some-new-flag --block-size 32 --other -1 --dtype half")
    assert args.block_size == 32
    assert args.dtype == "half"


def test_positional_model_wins_over_model_flag() -> None:
    assert parse_vllm_serve_args("/a --model /b").model == "/a"
    assert parse_vllm_serve_args("--model /b").model == "/b"


def test_served_model_name_takes_every_value_up_to_the_next_flag() -> None:
    args = parse_vllm_serve_args("--served-model-name a b c -tp 2 /models/x")
    assert args.served_model_name == "a"
    assert args.model == "/models/x"
    assert args.model_name == "a"
    assert parse_vllm_serve_args("/m").model_name == "/m"


def test_double_dash_ends_the_flags() -> None:
    args = parse_vllm_serve_args(["-tp", "2", "--", "--model-named-like-a-flag"])
    assert args.model == "--model-named-like-a-flag"


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("/m -tp two", "-tp"),
        ("/m -tp 0", "-tp"),
        ("/m --pipeline-parallel-size 1.5", "--pipeline-parallel-size"),
        ("/m --data-parallel-start-rank -1", "--data-parallel-start-rank"),
        ("/m --max-model-len lots", "--max-model-len"),
        ("/m --max-model-len 0", "--max-model-len"),
        ("/m --max-model-len=", "--max-model-len"),
        ("/m --max-num-batched-tokens 8KiB", "--max-num-batched-tokens"),
        ("/m --gpu-memory-utilization 1.5", "--gpu-memory-utilization"),
        ("/m --gpu-memory-utilization 0", "--gpu-memory-utilization"),
        ("/m --gpu-memory-utilization nan", "--gpu-memory-utilization"),
        ("/m --kv-cache-memory-bytes 1.5", "--kv-cache-memory-bytes"),
        ("/m --kv-cache-memory-bytes lots", "--kv-cache-memory-bytes"),
        ("/m --block-size", "--block-size"),
        ("/m --block-size --dtype half", "--block-size"),
        ("/m --kv-cache-dtype=", "--kv-cache-dtype"),
        ("/m --enable-prefix-caching=maybe", "--enable-prefix-caching"),
        ("/m --served-model-name", "--served-model-name"),
        ("/m --served-model-name -tp 2", "--served-model-name"),
        ("/m --num-gpu-blocks-override None", "--num-gpu-blocks-override"),
    ],
)
def test_invalid_values_name_the_flag(command: str, flag: str) -> None:
    with pytest.raises(ConfigError, match=f"^{flag}[ :]"):
        parse_vllm_serve_args(command)


def test_an_unbalanced_quote_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="quot"):
        parse_vllm_serve_args("/m --served-model-name 'oops")


# --- generated command lines ------------------------------------------------------------

# Field -> (spellings of its flag, strategy of values as vLLM would take them).
INTEGER_FLAGS: dict[str, tuple[list[str], st.SearchStrategy[int]]] = {
    "tensor_parallel_size": (["--tensor-parallel-size", "-tp"], st.integers(1, 64)),
    "pipeline_parallel_size": (["--pipeline-parallel-size", "-pp"], st.integers(1, 16)),
    "data_parallel_size": (["--data-parallel-size", "-dp"], st.integers(1, 64)),
    "data_parallel_size_local": (["--data-parallel-size-local", "-dpl"], st.integers(0, 8)),
    "data_parallel_start_rank": (["--data-parallel-start-rank", "-dpr"], st.integers(0, 64)),
    "decode_context_parallel_size": (["--decode-context-parallel-size", "-dcp"], st.integers(1, 8)),
    "max_model_len": (["--max-model-len"], st.integers(1, 2**20) | st.just(-1)),
    "block_size": (["--block-size"], st.sampled_from([16, 32, 64, 128])),
    "max_num_batched_tokens": (["--max-num-batched-tokens"], st.integers(1, 2**20)),
    "num_gpu_blocks_override": (["--num-gpu-blocks-override"], st.integers(1, 10**6)),
    "kv_cache_memory_bytes": (["--kv-cache-memory-bytes"], st.integers(0, 2**40)),
}
TEXT_FLAGS = {
    "kv_cache_dtype": ["auto", "fp8", "fp8_e5m2"],
    "dtype": ["auto", "bfloat16", "half"],
    "mamba_cache_dtype": ["auto", "float32"],
    "mamba_ssm_cache_dtype": ["auto", "float16"],
}
NOISE = ["--trust-remote-code", "--port 8000", "--seed=7", "-O3", "--uvicorn-log-level warning"]


@st.composite
def command_lines(draw: st.DrawFn) -> tuple[VllmServeArgs, list[str]]:
    values: dict[str, Any] = {}
    groups: list[list[str]] = []
    for field, (spellings, numbers) in INTEGER_FLAGS.items():
        if draw(st.booleans()):
            values[field] = draw(numbers)
            groups.append(spelled(draw, draw(st.sampled_from(spellings)), str(values[field])))
    for field, choices in TEXT_FLAGS.items():
        if draw(st.booleans()):
            values[field] = draw(st.sampled_from(choices))
            groups.append(spelled(draw, f"--{field.replace('_', '-')}", values[field]))
    if (caching := draw(st.sampled_from([None, True, False]))) is not None:
        values["enable_prefix_caching"] = caching
        groups.append([("--" if caching else "--no-") + "enable-prefix-caching"])
    groups += [shlex.split(noise) for noise in draw(st.lists(st.sampled_from(NOISE), max_size=4))]
    groups = draw(st.permutations(groups))
    values["model"] = "/models/m"
    return VllmServeArgs(**values), ["/models/m", *[token for group in groups for token in group]]


def spelled(draw: st.DrawFn, flag: str, value: str) -> list[str]:
    if flag.startswith("--") and draw(st.booleans()):
        flag = flag.replace("-", "_").replace("__", "--", 1)
    return [f"{flag}={value}"] if draw(st.booleans()) else [flag, value]


@settings(max_examples=200, deadline=None)
@given(case=command_lines())
def test_generated_command_lines(case: tuple[VllmServeArgs, list[str]]) -> None:
    expected, argv = case
    assert parse_vllm_serve_args(argv) == expected
    assert parse_vllm_serve_args(shlex.join(argv)) == expected
    assert parse_vllm_serve_args(["vllm", "serve", *argv]) == expected


def test_every_flag_fills_a_field() -> None:
    fields = {field.name for field in dataclasses.fields(VllmServeArgs)}
    assert {field for field, _ in vllm_args._FLAGS.values()} <= fields
    assert {field for field, _ in vllm_args._BOOLEANS.values()} <= fields
    # Every capacity setting can be given on the command line, except the platform, the
    # release and the GPU's compute capability: no `vllm serve` flag names them (the
    # engine's labels, /version and the GPU do).
    settings = {field.name for field in dataclasses.fields(EngineSettings)}
    settings -= {"platform", "vllm_version", "cuda_compute_capability"}
    assert settings <= fields


def test_config_file_flags_come_first_so_the_command_line_wins() -> None:
    files = {"/etc/vllm.yaml": "tensor_parallel_size: 2\nmax-model-len: 16k\nmodel: /m\n"
             "enable-prefix-caching: false\nserved_model_name: [a, b]\n"
             "speculative_config: {method: ngram, num_speculative_tokens: 4}\n"}  # fmt: skip
    args = parse_vllm_serve_args(
        "vllm serve --config /etc/vllm.yaml -tp 4", read_config=files.__getitem__
    )
    assert args.tensor_parallel_size == 4
    assert args.max_model_len == 16000
    assert args.model == "/m"
    assert args.enable_prefix_caching is False
    assert args.served_model_name == "a"
    assert args.speculative is not None
    assert args.speculative.num_speculative_tokens == 4
    assert args.config_file == "/etc/vllm.yaml"
    # Without a reader the file is only recorded (the pure parser does no I/O).
    assert parse_vllm_serve_args("m --config /etc/vllm.yaml").tensor_parallel_size is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [("[1, 2]", "must be a mapping"), ("a: [", "not valid YAML")],
)
def test_a_bad_config_file_names_the_flag(text: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=f"--config f.yaml: {re.escape(problem)}"):
        parse_vllm_serve_args("m --config f.yaml", read_config=lambda path: text)


def test_unknown_flags_are_listed_as_ignored() -> None:
    args = parse_vllm_serve_args("m --port 8000 --trust-remote-code -O3 --enable-chunked-prefill")
    assert args.ignored == ("--port 8000", "--trust-remote-code", "-O3", "--enable-chunked-prefill")
