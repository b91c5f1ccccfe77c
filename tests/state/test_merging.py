"""Records made from other records' fields, by name (exporter.merging)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from exporter.merging import alike_fields, converted


@dataclass(frozen=True, kw_only=True)
class Page:
    block_size: int
    dtype: str | None = None


@dataclass(frozen=True, kw_only=True)
class WindowedPage(Page):
    window: int = 0


@dataclass
class Reading:
    block_size: int = 16
    dtype: list[str] = field(default_factory=list)  # the same name, another type
    seen: int = 3


def test_converted_takes_the_targets_fields_by_name_and_drops_the_rest() -> None:
    assert converted(WindowedPage(block_size=32, dtype="fp8", window=128), Page) == Page(
        block_size=32, dtype="fp8"
    )


def test_converted_from_a_record_lacking_a_field_fails_naming_it() -> None:
    with pytest.raises(AttributeError, match="window"):
        converted(Page(block_size=32), WindowedPage)


def test_alike_fields_are_those_of_the_same_name_and_type() -> None:
    assert alike_fields(Reading(block_size=64, dtype=["x"]), Page) == {"block_size": 64}
