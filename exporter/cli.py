"""The `kvcap-exporter` command line: `serve`, `demo` and `capacity`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from exporter import __version__, capacity_cli, demo, serve
from exporter import collectors as _collectors  # noqa: F401 (importing registers them)
from exporter.errors import DoesNotFit, KvcapError
from exporter.flags import add_env_help, apply_env_defaults


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kvcap-exporter",
        description="Group-aware vLLM KV cache capacity, per engine, for Prometheus.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    serve.add_parser(subparsers)
    demo.add_parser(subparsers)
    capacity_cli.add_parser(subparsers)
    return parser


def apply_env_defaults_everywhere(
    parser: argparse.ArgumentParser, environ: Mapping[str, str]
) -> None:
    """Every subcommand's flags take KVCAP_* environment defaults."""
    for action in parser._actions:  # argparse has no public way to reach subparsers
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                add_env_help(subparser)
                apply_env_defaults(subparser, environ)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        apply_env_defaults_everywhere(parser, os.environ)
        args = parser.parse_args(argv)
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
