"""read_json: every JSON input kvcap reads, refused at the edge when kvcap could not write it."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.json_documents import NotJson, read_json


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"data": [{"id": "m\\ud800"}]}', "lone UTF-16 surrogate"),  # every render failed
        (b"\xff{}", "decode"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
        ("[" * 65 + "]" * 65, "nested deeper than 64 levels"),
        ('{"a": ' + "9" * 5000 + "}", "integer of 5,000 digits, more than the 40"),
        ('{"a": -' + "9" * 41 + "}", "integer of 41 digits"),
        ("{", "Expecting"),
    ],
    ids=["lone-surrogate", "not-utf8", "deep", "65-deep", "long-int", "41-digits", "truncated"],
)
def test_what_kvcap_cannot_carry_is_not_json(text: str | bytes, why: str) -> None:
    with pytest.raises(NotJson, match=why):
        read_json(text)


def test_documents_at_the_bounds_are_read() -> None:
    """64 levels, 40 digits, and brackets inside strings that do not nest."""
    assert read_json("[" * 64 + "]" * 64) is not None
    assert read_json('{"a": -' + "9" * 40 + "}") == {"a": -int("9" * 40)}
    assert read_json(b'{"a": "' + b"[{" * 100 + b'\\"[" }') == {"a": "[{" * 100 + '"['}
    assert read_json('["a\\"' + "[" * 70 + '"]') == ['a"' + "[" * 70]


def test_surrogate_pairs_and_non_finite_numbers_are_read() -> None:
    document = read_json('{"id": "m\\ud83d\\ude00", "x": NaN}')
    assert document["id"] == "m\U0001f600"
    assert math.isnan(document["x"])


@given(text=st.text(alphabet=st.sampled_from('{}[]":,\\ud800abc0123 '), max_size=40))
def test_a_document_read_can_be_written_again(text: str) -> None:
    try:
        document = read_json(text)
    except NotJson:
        return
    msgspec.json.encode(document)
