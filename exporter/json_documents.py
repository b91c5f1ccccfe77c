"""Reading JSON that kvcap did not write (a model's config.json, vLLM's /v1/models).

One rule for every JSON input: what Python's json reads but kvcap could not write out again
is refused here, at the edge, so no later step (a label, /engines) meets it.
"""

from __future__ import annotations

import itertools
import json
import re
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
# A string of valid JSON, escapes included; the brackets are counted outside strings only.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_TOO_DEEP = f"nested deeper than {MAX_JSON_DEPTH} levels, the most kvcap reads"


def read_json(text: str | bytes) -> Any:
    """The document, or NotJson for malformed text and for what json reads but UTF-8 cannot
    carry: an escaped lone surrogate ("\\ud800") becomes a str no UTF-8 writer accepts.

    NaN and Infinity are read, as transformers reads them; the capacity model refuses them
    where it reads a number.
    """
    try:
        document = json.loads(text, parse_int=_bounded_int)
    except NotJson:
        raise
    except RecursionError:  # nesting deeper than Python's json follows (about 1,000)
        raise NotJson(_TOO_DEEP) from None
    except ValueError as error:  # not JSON, not UTF-8
        raise NotJson(" ".join(str(error).split())[:200]) from None
    if isinstance(document, (dict, list)):
        _check_depth(text if isinstance(text, str) else _decoded(text))
    try:
        # Written out as UTF-8 again, with the standard library: msgspec would do it
        # faster, but importing it costs a `capacity` command more than its arithmetic.
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise NotJson("a string with a lone UTF-16 surrogate") from None
    except RecursionError:
        raise NotJson("nested deeper than kvcap writes out") from None
    return document


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise NotJson(
            f"an integer of {len(digits.lstrip('-')):,} digits, more than the "
            f"{MAX_JSON_INT_DIGITS} kvcap reads"
        )
    return int(digits)


def _check_depth(text: str) -> None:
    """Refuse nesting past MAX_JSON_DEPTH. Only for text json.loads accepted: there every
    string is well formed, so the string pattern runs in linear time."""
    brackets = _NOT_A_BRACKET.sub("", _STRING.sub("", text))
    if len(brackets) <= MAX_JSON_DEPTH:
        return
    if max(itertools.accumulate(map(_DEPTH_STEP.__getitem__, brackets))) > MAX_JSON_DEPTH:
        raise NotJson(_TOO_DEEP)


def _decoded(data: bytes) -> str:
    # json.loads read these bytes already, in the encoding it detects (UTF-8, -16 or -32).
    return data.decode(json.detect_encoding(data), "surrogatepass")
