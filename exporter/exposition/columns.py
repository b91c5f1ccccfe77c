"""How a metric family is declared: a table of rows (an entity and its labels), one column
per family (name, help, value; live columns for values that move with every change)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

Row = TypeVar("Row")


def label(value: object) -> str:
    """A label value as kvcap writes it: '' for unknown, true/false, repr of floats."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _no_labels(row: object) -> tuple[str, ...]:
    return ()


def _one(row: object) -> float:
    return 1


@dataclass(frozen=True, slots=True)
class Column(Generic[Row]):
    """One family: a sample per row where `value` is not None."""

    name: str
    help: str
    value: Callable[[Row], float | None] = _one
    # Labels of this family after the table's own, and their values for a row.
    extra_labels: tuple[str, ...] = ()
    extra: Callable[[Row], tuple[str, ...]] = _no_labels
    kind: Literal["gauge", "counter", "histogram"] = "gauge"
    # Changes with every read (usage, timestamps, staleness): rendered on every change of
    # the state, never cached.
    live: bool = False
    # A histogram: the bucket bounds (+Inf implied) and, per row, the count in each
    # bucket (not cumulative, +Inf last) and the sum of the observations.
    bounds: tuple[float, ...] = ()
    observations: Callable[[Row], tuple[Sequence[int], float]] | None = None


def live_gauge(name: str, help_text: str, value: Callable[[Row], float | None]) -> Column[Row]:
    """A gauge read afresh on every change of the state (usage, timestamps, staleness)."""
    return Column(name, help_text, value, live=True)


@dataclass(frozen=True, slots=True)
class Table(Generic[Row]):
    """The families of one entity: the entity's labels, its rows, one column per family."""

    labels: tuple[str, ...]
    ids: Callable[[Row], tuple[str, ...]]
    columns: tuple[Column[Row], ...]


@dataclass(frozen=True, slots=True)
class ScrapeTable(Generic[Row]):
    """A table whose rows are read afresh on every scrape (the HTTP server's counters,
    process_*), not from the snapshot. `version`, where given, changes whenever the rows
    do: while it stands, the last scrape's bytes are served again."""

    table: Table[Row]
    rows: Callable[[], Sequence[Row]]
    version: Callable[[], int] | None = None
