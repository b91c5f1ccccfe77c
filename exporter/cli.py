"""The `kvcap-exporter` command line: `serve`, `demo`, `capacity` and `nvml-check`.

Exit status: 0 success; 1 kvcap could not do what was asked (a file it cannot read, a port
in use, a model that does not fit); 2 the command line itself is wrong (an unknown flag, a
malformed value, a bad KVCAP_* twin). Every failure is one line on stderr naming the flag
and the cause; `--log.level debug` adds the traceback of an unexpected error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import NoReturn

from exporter import __version__, capacity_cli
from exporter.errors import KvcapError, UsageError
from exporter.flags import Flags

PROG = "kvcap-exporter"
USAGE_ERROR = 2
KVCAP_ERROR = 1


class CommandLineParser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage and exiting, so every
    error leaves the same way (one line; JSON where `capacity --json` asked for it)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


# Each command's module, imported only when that command runs (or for the top-level
# help): `serve` pulls in prometheus_client, ZMQ, NVML and structlog, which a `capacity`
# run, meant to answer as fast as a shell command, never uses.
COMMANDS = {
    "serve": "exporter.serve",
    "demo": "exporter.demo",
    "capacity": "exporter.capacity_cli",
    "nvml-check": "exporter.nvml_check",
}


def build_parser(command: str | None = None) -> tuple[argparse.ArgumentParser, list[Flags]]:
    """The parser; with a known `command`, the one that command's flags need alone."""
    parser = CommandLineParser(
        prog=PROG,
        description="Group-aware vLLM KV cache capacity, per engine, for Prometheus.",
        epilog="Exit status: 0 ok, 1 kvcap error (files, ports, capacity), 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = [command] if command in COMMANDS else list(COMMANDS)
    commands = [importlib.import_module(COMMANDS[name]).add_parser(subparsers) for name in names]
    return parser, commands


def parse(argv: Sequence[str], environ: Mapping[str, str]) -> argparse.Namespace:
    """Flags and environment twins to a namespace; raises UsageError."""
    parser, commands = build_parser(argv[0] if argv else None)
    for flags in commands:
        flags.apply_environment(environ)
    head, tail = capacity_cli.split_vllm_command(list(argv))
    args, extras = parser.parse_known_args(head)
    if args.command == "capacity":
        args.vllm_tokens = extras
        args.vllm_tail = tail
    elif extras or tail is not None:
        unknown = extras or ["--"]
        hint = _closest_flag(unknown[0], commands)
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}{hint} (see {PROG} --help)")
    return args


def _closest_flag(typed: str, commands: Sequence[Flags]) -> str:
    """ "; did you mean --web.listen-address?" for a mistyped flag (Python 3.11's argparse
    names none), or nothing when no flag is close."""
    import difflib  # noqa: PLC0415 (only a mistyped command line pays for it)

    options = [option for flags in commands for option in flags.spellings]
    closest = difflib.get_close_matches(typed.partition("=")[0][:80], options, n=1)
    return f"; did you mean {closest[0]}?" if closest else ""


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # `capacity --json | head`: the reader has what it wanted. Nothing more can be
        # written; stdout goes to /dev/null so that the exit flush does not fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args: argparse.Namespace | None = None
    try:
        args = parse(argv, os.environ)
        code: int = args.handler(args)
    except UsageError as error:
        return _fail(argv, args, error, USAGE_ERROR)
    except KvcapError as error:
        return _fail(argv, args, error, KVCAP_ERROR)
    except Exception as error:  # the last line of defence: one line, no traceback
        if _debug(args):
            traceback.print_exc()
        return _fail(argv, args, error, KVCAP_ERROR)
    return code


def _fail(argv: Sequence[str], args: argparse.Namespace | None, error: Exception, code: int) -> int:
    if capacity_cli.wants_json(argv, args):
        capacity_cli.print_error_json(error, sys.stdout)
        return code
    print(f"{PROG}: {capacity_cli.one_line(error)}", file=sys.stderr)
    return code


def _debug(args: argparse.Namespace | None) -> bool:
    level = getattr(args, "log_level", None) or os.environ.get("KVCAP_LOG_LEVEL", "")
    return str(level).lower() == "debug"


if __name__ == "__main__":
    raise SystemExit(main())
