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


def read_json(text: str | bytes) -> Any:
    """The document, or NotJson for malformed text and for what json reads but UTF-8 cannot
    carry: an escaped lone surrogate ("\\ud800") becomes a str no UTF-8 writer accepts.

    NaN and Infinity are read, as transformers reads them; the capacity model refuses them
    where it reads a number.
    """
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as error:
        # ValueError: not JSON, not UTF-8, or an integer of over 4,300 digits;
        # RecursionError: nesting deeper than Python's json follows.
        raise NotJson(str(error)) from None
    try:
        # Written out as UTF-8 again, with the standard library: msgspec would do it
        # faster, but importing it costs a `capacity` command more than its arithmetic.
        json.dumps(document, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise NotJson("a string with a lone UTF-16 surrogate") from None
    except RecursionError:
        raise NotJson("nested deeper than kvcap writes out") from None
    return document
