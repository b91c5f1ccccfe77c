"""Command-line flags with KVCAP_ environment twins.

`--web.listen-address` has the twin KVCAP_WEB_LISTEN_ADDRESS.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from exporter.errors import ConfigError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_name(option: str) -> str:
    return "KVCAP_" + option.lstrip("-").upper().replace(".", "_").replace("-", "_")


def apply_env_defaults(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """Let KVCAP_* variables set defaults; a flag on the command line still wins."""
    for action in parser._actions:  # argparse keeps no public list of actions
        long_options = [
            o for o in action.option_strings if o.startswith("--") and not o.startswith("--no-")
        ]
        if not long_options or action.dest == "help":
            continue
        name = env_name(long_options[0])
        if name not in environ:
            continue
        raw = environ[name]
        action.default = _convert(action, name, raw)
        action.required = False


def _convert(action: argparse.Action, name: str, raw: str) -> object:
    if isinstance(action, argparse.BooleanOptionalAction) or action.nargs == 0:
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ConfigError(f"{name} must be true or false, got {raw!r}")
    if isinstance(action, argparse._AppendAction):
        return [_typed(action, name, part.strip()) for part in raw.split(",") if part.strip()]
    return _typed(action, name, raw)


def _typed(action: argparse.Action, name: str, raw: str) -> object:
    if action.type is None or not callable(action.type):
        return raw
    try:
        return action.type(raw)
    except (ValueError, TypeError, argparse.ArgumentTypeError, ConfigError) as error:
        raise ConfigError(f"{name}: {error}") from None


def add_env_help(parser: argparse.ArgumentParser) -> None:
    """Mention each flag's environment twin in --help."""
    for action in parser._actions:
        long_options = [o for o in action.option_strings if o.startswith("--")]
        if long_options and action.dest != "help" and action.help is not argparse.SUPPRESS:
            twin = env_name(long_options[0].replace("--no-", "--"))
            action.help = f"{action.help or ''} [env {twin}]".strip()
