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
        ("[" * 100_000 + "]" * 100_000, "recursion"),
        ('{"a": ' + "9" * 5000 + "}", "4300"),
        ("{", "Expecting"),
    ],
    ids=["lone-surrogate", "not-utf8", "deep", "long-int", "truncated"],
)
def test_what_kvcap_cannot_carry_is_not_json(text: str | bytes, why: str) -> None:
    with pytest.raises(NotJson, match=why):
        read_json(text)


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
