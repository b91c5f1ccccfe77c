"""Sample values written as prometheus_client writes them, whatever the number."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.utils import floatToGoString

from exporter.exposition import sample_value

edges = st.sampled_from([0, 1, 9, 10, 999_999, 1_000_000, 1_000_001, 10**7, 2**53 - 1, 2**53])


@given(st.integers(min_value=-(2**64), max_value=2**64) | edges | st.floats() | st.booleans())
def test_values_are_written_as_prometheus_client_writes_them(value: float) -> None:
    assert sample_value(value) == floatToGoString(value)  # type: ignore[no-untyped-call]
