"""The flags each vLLM release's `vllm serve` accepts: the generated table, its reading of
a release's source, and the check kvcap runs on the flags it does not model."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from exporter.capacity import RELEASES
from exporter.capacity.serve_flags import (
    DATA,
    MAX_FLAG_CHARS,
    accepted_flags,
    release_flags,
    releases,
)
from exporter.collectors.parsing.vllm_args import _BOOLEANS, _FLAGS
from exporter.errors import UsageError
from tests.support import load_script

ROOT = Path(__file__).resolve().parents[2]
# A miniature of the shapes vLLM's serve parser declares its flags in, written for this
# test (not vLLM's code); the generator reads source, never imports it.
MINIATURE = {
    "engine/arg_utils.py": """\
# Explicit flags, aliases, flags spread from get_kwargs of a config dataclass, bool
# fields (argparse adds --no-FLAG), store_true.
import argparse
from dataclasses import dataclass


@dataclass
class EngineArgs:
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    enable_prefix_caching: bool | None = None
    hf_token: bool | str | None = None
    enable_stochastic_rounding: bool = False

    @staticmethod
    def add_cli_args(parser):
        parallel_kwargs = get_kwargs(ParallelConfig)
        group = parser.add_argument_group("parallel")
        group.add_argument(
            "--tensor-parallel-size", "-tp", **parallel_kwargs["tensor_parallel_size"]
        )
        group.add_argument("--enforce-eager", **parallel_kwargs["enforce_eager"])
        group.add_argument(
            "--enable-prefix-caching",
            **{**parallel_kwargs["enable_prefix_caching"], "default": None},
        )
        group.add_argument("--hf-token", **parallel_kwargs["hf_token"])
        group.add_argument("--stochastic-rounding", **parallel_kwargs["enable_stochastic_rounding"])
        group.add_argument("--disable-log-stats", action="store_true")
        group.add_argument("--enable-lora", action=argparse.BooleanOptionalAction)
        return parser
""",
    "entrypoints/openai/cli_args.py": """\
# The frontend's shape: a dataclass whose fields become flags in a loop, and make_arg_parser.
from dataclasses import dataclass


@dataclass
class FrontendArgs:
    port: int = 8000
    enable_auto_tool_choice: bool = False


def make_arg_parser(parser):
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--api-server-count", "-asc", type=int, default=1)
    parser.add_argument(f"--{'computed'}", type=int)  # not a literal: not read
    return parser
""",
    "entrypoints/cli/serve.py": "# `vllm serve` adds no flags of its own here.\n",
}


def generator() -> ModuleType:
    return load_script(ROOT / "scripts/vllm_serve_flags.py")


def test_the_table_covers_every_release_kvcap_plans_for() -> None:
    (major, first, _), (_, last, _) = RELEASES[0].release, RELEASES[-1].release
    assert releases() == tuple(f"{major}.{minor}" for minor in range(first, last + 1))


def test_every_flag_kvcap_models_is_one_the_newest_release_accepts() -> None:
    """kvcap reads these flags without the table; each is a real `vllm serve` flag."""
    table = json.loads(DATA.read_text())["flags"]
    for flag in {*_FLAGS, *_BOOLEANS}:
        assert flag in release_flags(releases()[-1]), flag
        assert table[flag].endswith("0.33"), (flag, table[flag])


def test_a_flag_removed_later_is_known_only_to_its_releases() -> None:
    assert "--swap-space" in release_flags("0.17")
    assert "--swap-space" not in release_flags("0.18")
    assert "--mamba-cache-mode" not in release_flags("0.14")
    assert "--mamba-cache-mode" in release_flags("0.15")


def test_the_check_reads_flags_as_vllms_parser_does() -> None:
    check = accepted_flags("0.33.0", own=["--gpu-memory"])
    assert check is not None
    assert check("--port") == "--port"
    assert check("--tensor-parallel") == "--tensor-parallel-size"  # a unique prefix
    assert check("-O3") == "-O3"  # rewritten by vLLM's parser
    assert check("--compilation-config.mode") == "--compilation-config.mode"
    with pytest.raises(UsageError, match=r"did you mean --tensor-parallel-size\?$"):
        check("--tensor-paralel-size")
    with pytest.raises(UsageError, match=r"^unknown flag --gpu-memroy: .*did you mean --gpu-m"):
        check("--gpu-memroy")
    with pytest.raises(UsageError, match="ambiguous vllm serve flag --max"):
        check("--max")


def test_releases_outside_the_table_are_not_checked() -> None:
    assert accepted_flags("0.9.2") is None
    assert accepted_flags("0.40.0") is None
    assert accepted_flags("latest") is None  # --vllm-version's own check refuses it


@pytest.mark.parametrize(
    "hostile", ["--" + "x" * 100_000, "--tensör-parallel-size", "--\x00", "--=", "---"]
)
def test_a_hostile_flag_gets_one_bounded_line(hostile: str) -> None:
    check = accepted_flags(None)
    assert check is not None
    with pytest.raises(UsageError) as refused:
        check(hostile)
    message = str(refused.value)
    assert len(message) < MAX_FLAG_CHARS + 200
    assert "\n" not in message


def test_the_generator_reads_a_releases_flags_from_its_source(tmp_path: Path) -> None:
    for name, text in MINIATURE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    options = generator().static_options(tmp_path)
    assert options == {
        "-h", "--help", "--tensor-parallel-size", "-tp", "--enforce-eager",
        "--no-enforce-eager", "--enable-prefix-caching", "--no-enable-prefix-caching",
        "--hf-token", "--stochastic-rounding", "--no-stochastic-rounding",
        "--disable-log-stats", "--enable-lora",
        "--no-enable-lora", "--port", "--enable-auto-tool-choice",
        "--no-enable-auto-tool-choice", "--api-server-count", "-asc",
    }  # fmt: skip


def test_the_generator_writes_first_and_last_release() -> None:
    module = generator()
    assert module._ranges([0, 1, 2, 5], ["0.10", "0.11", "0.12", "0.13", "0.14", "0.15"]) == (
        "0.10-0.12,0.15"
    )
