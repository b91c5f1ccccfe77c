"""Command-line flags declared with their KVCAP_ environment twins.

    flags = Flags(parser)
    web = flags.group("web")
    web.add("--web.listen-address", metavar="ADDRESS", default=":9470", help="...")

`--web.listen-address` gets the twin KVCAP_WEB_LISTEN_ADDRESS; its help line ends with
"(default :9470; env KVCAP_WEB_LISTEN_ADDRESS)". A flag on the command line wins over its
twin, the twin over the default.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from exporter.errors import ConfigError, UsageError
from exporter.units import format_duration, format_size, parse_duration, parse_size

Number = TypeVar("Number", int, float)
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def env_name(option: str) -> str:
    """`--web.listen-address` -> `KVCAP_WEB_LISTEN_ADDRESS`."""
    return "KVCAP_" + option.lstrip("-").upper().replace(".", "_").replace("-", "_")


def dest_name(option: str) -> str:
    """`--web.listen-address` -> `web_listen_address`, where argparse puts its value."""
    return option.lstrip("-").replace(".", "_").replace("-", "_")


@dataclass(frozen=True, slots=True)
class Flag:
    """One declared flag: how it is spelled, where its value goes and how text becomes it."""

    option: str
    dest: str
    env: str | None
    default: object
    kind: str  # "value", "switch" (on/off) or "list" (repeatable, or comma-separated in env)
    convert: Callable[[str], Any] | None
    secret: bool = False
    choices: tuple[str, ...] | None = None

    def from_text(self, raw: str, where: str) -> object:
        """The value of `raw` (an environment variable's text); UsageError names `where`."""
        if self.kind == "switch":
            value = raw.strip().lower()
            if value in _TRUE:
                return True
            if value in _FALSE:
                return False
            raise UsageError(f"{where} must be true or false, got {raw!r}")
        if self.kind == "list":
            return [self._one(part.strip(), where) for part in raw.split(",") if part.strip()]
        return self._one(raw, where)

    def _one(self, raw: str, where: str) -> object:
        if self.choices is not None and raw not in self.choices:
            # As argparse says it for the flag: the twin is checked the same way.
            choices = ", ".join(self.choices)
            raise UsageError(f"{where}: invalid choice {raw!r} (choose from {choices})")
        if self.convert is None:
            return raw
        try:
            return self.convert(raw)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as error:
            raise UsageError(f"{where}: {error}") from None
        except UsageError as error:
            raise UsageError(f"{where}: {error}") from None


def show(value: object) -> str:
    """A flag value as a person would type it: on/off, lists joined by commas."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    if value is None:
        return "none"
    if isinstance(value, list | tuple):
        return ",".join(show(v) for v in value) if value else "none"
    return str(value)


class Flags:
    """Every flag of one (sub)command, as declared; the parser never has to be searched."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser
        self.declared: list[Flag] = []
        self.spellings: list[str] = []  # every option string, aliases and --no- forms too
        # The text each value flag was last given as (command line or KVCAP_*), for active().
        self.given: dict[str, str] = {}

    def group(self, title: str) -> FlagGroup:
        return FlagGroup(self, self.parser.add_argument_group(title))

    def apply_environment(self, environ: Mapping[str, str]) -> None:
        """Let KVCAP_* variables set defaults; a flag on the command line still wins."""
        defaults = {
            flag.dest: flag.from_text(environ[flag.env], flag.env)
            for flag in self.declared
            if flag.env is not None and flag.env in environ
        }
        for flag in self.declared:
            if flag.kind == "value" and flag.env is not None and flag.env in environ:
                self.given[flag.dest] = environ[flag.env]
        self.parser.set_defaults(**defaults)

    def active(self, args: argparse.Namespace) -> Iterator[tuple[str, str]]:
        """(flag, value as typed) of every declared flag, secrets masked: the text it was
        given as (`5s`, `8MiB`), else its value in the units it is typed in."""
        for flag in self.declared:
            value = getattr(args, flag.dest, flag.default)
            if flag.secret and value:
                yield flag.option, "<secret>"
            else:
                yield flag.option, self._as_typed(flag, value)

    def _as_typed(self, flag: Flag, value: object) -> str:
        given = self.given.get(flag.dest)
        if given is not None and flag.kind == "value":
            try:
                same = (flag.convert(given) if flag.convert else given) == value
            except (ValueError, TypeError, argparse.ArgumentTypeError, UsageError):
                same = False
            if same:
                return given
        return _shown(flag.convert, value)


class FlagGroup:
    """A titled group of flags in --help."""

    def __init__(self, flags: Flags, group: argparse._ArgumentGroup) -> None:
        self._flags = flags
        self._group = group

    def add(
        self,
        option: str,
        *aliases: str,
        help: str,
        metavar: str | None = None,
        default: object = None,
        type: Callable[[str], Any] | None = None,
        choices: Sequence[str] | None = None,
        switch: bool = False,
        repeatable: bool = False,
        dest: str | None = None,
        env: bool = True,
        default_text: str | None = None,
        secret: bool = False,
    ) -> None:
        """Declare `option`. A value flag needs a metavar naming what the value is.

        `switch` makes an on/off flag with a `--no-` form; `repeatable` collects a list.
        `default_text` says the default in words where the value alone would not; a
        duration or size default is shown as one is written (`5s`, `8MiB`), and the type
        names the metavar when none is given.
        """
        dest = dest or dest_name(option)
        twin = env_name(option) if env else None
        shown = default_text if default_text is not None else _shown(type, default)
        metavar = metavar or _METAVARS.get(type)
        suffix = f"default {shown}" + (f"; env {twin}" if twin else "")
        text = f"{help} ({suffix})"
        kwargs: dict[str, Any] = {"dest": dest, "default": default, "help": text}
        if switch:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            if metavar is None and choices is None:
                raise ValueError(f"{option} needs a metavar")  # a programming error
            kwargs.update(metavar=metavar, type=type, choices=choices)
            if repeatable:
                kwargs["action"] = "append"
        kind = "switch" if switch else "list" if repeatable else "value"
        if type is not None and kind == "value":
            kwargs["type"] = self._recording(dest, type)
        self._group.add_argument(option, *aliases, **kwargs)
        self._flags.spellings += [option, *aliases, *(["--no-" + option[2:]] if switch else [])]
        allowed = tuple(choices) if choices is not None else None
        self._flags.declared.append(Flag(option, dest, twin, default, kind, type, secret, allowed))

    def add_fields(self, flags: Iterable[FieldFlag], defaults: object) -> None:
        """Declare `flags` in order, each defaulting to its field of `defaults` (the
        settings as constructed with no arguments)."""
        for flag in flags:
            self.add(
                flag.option,
                help=flag.help,
                metavar=flag.metavar,
                type=flag.type,
                default=getattr(defaults, flag.field),
                default_text=flag.default_text,
                switch=flag.switch,
                choices=flag.choices,
            )

    def _recording(self, dest: str, convert: Callable[[str], Any]) -> Callable[[str], Any]:
        """`convert`, keeping the text it converted (argparse calls it for the flag)."""

        @functools.wraps(convert)
        def typed(text: str) -> Any:
            value = convert(text)
            self._flags.given[dest] = text
            return value

        return typed


@dataclass(frozen=True, slots=True)
class FieldFlag:
    """A flag that sets one field of a settings dataclass as parsed; its default is the
    field's own, so a default is written once (on the settings)."""

    option: str
    field: str
    help: str
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    default_text: str | None = None
    switch: bool = False
    choices: tuple[str, ...] | None = None


def field_values(args: argparse.Namespace, flags: Iterable[FieldFlag]) -> dict[str, Any]:
    """The fields `flags` set, as parsed: keyword arguments for the settings."""
    return {flag.field: getattr(args, dest_name(flag.option)) for flag in flags}


# Value types for flags: argparse reports their errors as usage errors naming the flag.


def size(text: str) -> int:
    """Bytes: `32MiB`, `1G`, `1048576`."""
    value: int = _argparse_type(parse_size, text)
    return value


def duration(text: str) -> float:
    """Seconds, more than zero: `5s`, `250ms`, `1m`, `2.5`."""
    seconds: float = _argparse_type(parse_duration, text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than zero, got {text!r}")
    return seconds


def positive_int(text: str) -> int:
    """A whole number, 1 or more."""
    value = _number(int, "a whole number", text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_number(text: str) -> float:
    """A finite number above zero."""
    value = _number(float, "a number", text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _number(convert: Callable[[str], Number], what: str, text: str) -> Number:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None


def _shown(convert: Callable[[str], Any] | None, value: object) -> str:
    """A flag's value as one would write it: a duration `5s`, a size `8MiB`."""
    if convert is duration and isinstance(value, int | float):
        return format_duration(value)
    if convert is size and isinstance(value, int):
        return format_size(value)
    return show(value)


# The metavar of a flag of these types, unless it names its own.
_METAVARS: dict[Callable[[str], Any] | None, str] = {duration: "DURATION", size: "SIZE"}


def _argparse_type(parse: Callable[[str], Any], text: str) -> Any:
    try:
        return parse(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def log_level(text: str) -> str:
    """`debug`, `info`, `warn` (or `warning`, as the logs print it), `error`."""
    from exporter.logs import parse_level  # noqa: PLC0415 (exporter.logs loads structlog)

    try:
        return parse_level(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
