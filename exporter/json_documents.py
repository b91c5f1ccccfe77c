"""Reading JSON that kvcap did not write (a model's config.json, vLLM's /v1/models).

One rule for every JSON input: what Python's json reads but kvcap could not write out again
is refused here, at the edge, so no later step (a label, /engines) meets it.
"""

from __future__ import annotations

import json
from typing import Any

from exporter.errors import MalformedInput


class NotJson(MalformedInput):
    """The text is not JSON kvcap accepts; the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__("not_json", message)


# Nesting past any document kvcap reads (a config.json is 3 or 4 deep; /v1/models 3), far
# under Python's recursion limit, so a deep one is one clean refusal.
MAX_JSON_DEPTH = 64
# Digits of one integer: 2**64 has 20; Python's int() refuses past 4,300 with a ValueError
# of its own, this says which bound it is.
MAX_JSON_INT_DIGITS = 40
_TOO_DEEP = f"nested deeper than {MAX_JSON_DEPTH} levels, the most kvcap reads"
_TOO_LONG = "an integer of {digits} digits, more than the " + f"{MAX_JSON_INT_DIGITS} kvcap reads"
_CONTAINERS = frozenset((dict, list))  # what json.loads makes of objects and arrays


def read_json(text: str | bytes | bytearray) -> Any:
    """The document, or NotJson for malformed text, for what is past the bounds of
    load_bounded_json, and for what json reads but UTF-8 cannot carry: an escaped lone
    surrogate ("\\ud800") becomes a str no UTF-8 writer accepts.

    NaN and Infinity are read, as transformers reads them; the capacity model refuses them
    where it reads a number.
    """
    document = load_bounded_json(text)
    try:
        # Written out as UTF-8 again, with the standard library: msgspec would do it
        # faster, but importing it costs a `capacity` command more than its arithmetic.
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise NotJson("a string with a lone UTF-16 surrogate") from None
    return document


def load_bounded_json(text: str | bytes | bytearray) -> Any:
    """json.loads within MAX_JSON_DEPTH and MAX_JSON_INT_DIGITS; NotJson otherwise. For a
    document kvcap only computes from (a `--cases` record), not one it shows in labels."""
    try:
        document = json.loads(text, parse_int=_bounded_int)
    except NotJson:
        raise
    except RecursionError:  # nesting deeper than Python's json follows (about 1,000)
        raise NotJson(_TOO_DEEP) from None
    except ValueError as error:  # not JSON, not UTF-8
        raise NotJson(" ".join(str(error).split())[:200]) from None
    if _too_deep(document):
        raise NotJson(_TOO_DEEP)
    return document


def _bounded_int(digits: str) -> int:
    # Called by json.loads for each integer, before int() would refuse one past 4,300
    # digits with a ValueError of its own (Python 3.11).
    if len(digits) > MAX_JSON_INT_DIGITS + digits.startswith("-"):
        raise NotJson(_TOO_LONG.format(digits=f"{len(digits.lstrip('-')):,}"))
    return int(digits)


def _too_deep(document: Any) -> bool:
    """Whether lists and objects nest past MAX_JSON_DEPTH: a walk over the containers
    after json.loads (which makes plain dicts and lists, so exact type tests are enough)."""
    stack = [(document, 0)] if type(document) in _CONTAINERS else []
    while stack:
        node, depth = stack.pop()
        if depth >= MAX_JSON_DEPTH:
            return True
        children = node.values() if type(node) is dict else node
        # The types of a container's items are gathered at C speed: most hold no container.
        if not _CONTAINERS.isdisjoint(map(type, children)):
            stack.extend((child, depth + 1) for child in children if type(child) in _CONTAINERS)
    return False
