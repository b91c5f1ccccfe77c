"""The `kvcap-exporter` command line: `capacity` and `demo` (the daemon's `serve` comes next)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import resources
from typing import Any, TextIO

from exporter import __version__, capacity_cli
from exporter.capacity import EngineSettings, derive_capacity
from exporter.errors import DoesNotFit, KvcapError

# The bundled demo: real model configs with deployments like the golden fixtures'.
_DEMO_ENGINES: tuple[tuple[str, EngineSettings, int], ...] = (
    ("llama-3.1-8b", EngineSettings(max_model_len=32768), 30 * 2**30),
    ("gemma-3-27b-text", EngineSettings(tensor_parallel_size=2), 40 * 2**30),
    ("qwen3-next-80b-a3b", EngineSettings(tensor_parallel_size=2), 40 * 2**30),
    ("jamba-mini", EngineSettings(max_model_len=32768), 18_000_000_000),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcap-exporter",
        description="Group-aware vLLM KV cache capacity, per engine, for Prometheus.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    capacity_cli.add_parser(subparsers)
    demo = subparsers.add_parser("demo", help="show the capacity model on bundled example models")
    demo.set_defaults(handler=run_demo)
    return parser


def example_config(name: str) -> dict[str, Any]:
    text = resources.files("exporter.examples").joinpath(f"{name}.json").read_text("utf-8")
    config: dict[str, Any] = json.loads(text)
    return config


def run_demo(args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    del args
    for name, settings, kv_bytes in _DEMO_ENGINES:
        result = derive_capacity(
            example_config(name), settings, available_kv_bytes_per_worker=kv_bytes
        )
        out.write(
            f"== {name} (tp={settings.tensor_parallel_size}, {kv_bytes / 2**30:.1f} GiB KV "
            "per worker)\n"
        )
        out.write(capacity_cli.format_result(result) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except DoesNotFit as error:
        print(f"kvcap-exporter: {error.summary}", file=sys.stderr)
        print(f"vLLM's message: {error}", file=sys.stderr)
        return 1
    except KvcapError as error:
        print(f"kvcap-exporter: error: {error}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    raise SystemExit(main())
