"""The flags each vLLM release's `vllm serve` accepts, so that a flag vLLM would refuse
is refused here too, with the closest flag named.

    check = accepted_flags("0.18.1", own=["--gpu-memory"])
    check("--tensor-parallel")      -> "--tensor-parallel-size" (argparse's abbreviation)
    check("--tensor-paralel-size")  -> UsageError: unknown vllm serve flag ... did you mean
                                       --tensor-parallel-size?

The flags are generated from each release's own engine and frontend arguments by
scripts/vllm_serve_flags.py into vllm_serve_flags.json (first-last release of each).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

from exporter.capacity.releases import NEWEST, parse_version
from exporter.errors import ConfigError, UsageError

DATA = Path(__file__).with_name("vllm_serve_flags.json")
# An unknown flag is shown, and compared with the known ones, up to this many characters.
MAX_FLAG_CHARS = 80


@cache
def _document() -> tuple[tuple[str, ...], dict[str, str]]:
    document = json.loads(DATA.read_text(encoding="utf-8"))
    return tuple(document["releases"]), document["flags"]


def releases() -> tuple[str, ...]:
    """The minor releases read, oldest first ("0.10", ..., "0.33")."""
    return _document()[0]


def release_flags(release: str) -> frozenset[str]:
    """Every option string `vllm serve` of that minor release accepts."""
    order = {name: index for index, name in enumerate(releases())}
    wanted = order[release]
    accepted = set()
    for flag, spans in _document()[1].items():
        for span in spans.split(","):
            first, _, last = span.partition("-")
            if order[first] <= wanted <= order[last or first]:
                accepted.add(flag)
                break
    return frozenset(accepted)


def _minor(version: str) -> str:
    major, minor, _ = parse_version(version)
    return f"{major}.{minor}"


def accepted_flags(version: str | None, *, own: Iterable[str] = ()) -> Callable[[str], str] | None:
    """A check of one flag (underscores already dashes) against the release kvcap plans
    with (the newest without one): it returns the option vLLM reads the flag as, or
    raises UsageError as vLLM would refuse it. `own` are kvcap's flags, named when one
    of them is the closest. None for a release outside those read: nothing to check by."""
    try:
        release = _minor(version or ".".join(map(str, NEWEST.release)))
    except ConfigError:  # not a release number: --vllm-version's own check says so
        return None
    if release not in releases():
        return None
    options = release_flags(release)
    own_flags = frozenset(own)

    def check(flag: str) -> str:
        return _resolve(flag, release, options, own_flags)

    return check


def _resolve(flag: str, release: str, options: frozenset[str], own: frozenset[str]) -> str:
    if flag in options or flag.startswith("-O"):
        # vLLM's parser rewrites -O3, -O=3, -O.level, -Odecode before argparse sees them.
        return flag
    if flag.startswith("--"):
        base = flag.partition(".")[0]  # `--compilation-config.level 3`: one key of a JSON flag
        if base != flag and base in options:
            return flag
        # vLLM's parser keeps argparse's allow_abbrev: a unique prefix is that flag.
        matches = sorted(option for option in options if option.startswith(flag))
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise UsageError(
                f"ambiguous vllm serve flag {flag} (vLLM {release} refuses it): it could be "
                + ", ".join(matches[:6])
                + (", ..." if len(matches) > 6 else "")
            )
    elif len(flag) > 2 and flag[:2] in options:
        return flag  # `-O3`: a one-letter flag with its value attached
    raise UsageError(_unknown(flag, release, options, own))


def _unknown(flag: str, release: str, options: frozenset[str], own: frozenset[str]) -> str:
    import difflib  # noqa: PLC0415 (only a refused flag pays for it)

    shown = flag if len(flag) <= MAX_FLAG_CHARS else flag[:MAX_FLAG_CHARS] + "..."
    closest = difflib.get_close_matches(flag[:MAX_FLAG_CHARS], [*options, *own], n=1)
    if closest and closest[0] in own and closest[0] not in options:
        return (
            f"unknown flag {shown}: not a kvcap capacity flag, and vLLM {release} refuses it;"
            f" did you mean {closest[0]}?"
        )
    message = f"unknown vllm serve flag {shown} (vLLM {release} refuses it)"
    elsewhere = _document()[1].get(flag)
    if elsewhere is not None:  # a flag of other releases: say which
        message += f"; vLLM {elsewhere} accepted it"
    return f"{message}; did you mean {closest[0]}?" if closest else message
