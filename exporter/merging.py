"""One way to merge records of one thing from several producers: field by field, the first
known value (producers in order, best first). None, an empty tuple and an empty string
are unknown; everything else (0, False) is known. And one way to make a record of one
type from another's fields."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import fields
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

Record = TypeVar("Record")
Dataclass = TypeVar("Dataclass", bound="DataclassInstance")


_GETTERS: dict[type, Callable[[Any], tuple[Any, ...]]] = {}


def _values_of(kind: type) -> Callable[[Any], tuple[Any, ...]]:
    found = _GETTERS.get(kind)
    if found is None:
        names = [field.name for field in fields(kind)]
        getter = attrgetter(*names)
        found = _GETTERS[kind] = (lambda r: (getter(r),)) if len(names) == 1 else getter
    return found


def first_known(records: Sequence[Record]) -> Record:
    """The record whose each field is the first known one of `records` (at least one, all
    of one dataclass type whose fields are all init fields). One record is returned
    itself: a merge of one changes nothing, and keeps the object a cache may key on."""
    if len(records) == 1:
        return records[0]
    values_of = _values_of(type(records[0]))
    merged = list(values_of(records[0]))
    for record in records[1:]:
        for index, found in enumerate(values_of(record)):
            known = merged[index]
            if known is None or known in ((), ""):
                merged[index] = found
    return type(records[0])(*merged)


def converted(record: Any, kind: type[Dataclass]) -> Dataclass:
    """A `kind` (a dataclass) made of `record`'s values of `kind`'s fields, by name: a
    conversion between related records that lists no field, so a field added to `kind`
    is carried without an edit here."""
    return kind(**{field.name: getattr(record, field.name) for field in fields(kind)})


def alike_fields(record: Any, kind: type) -> dict[str, Any]:
    """`record`'s values of the fields it declares as `kind` does (the same name and type):
    what a builder of `kind` copies as it is, without naming each field."""
    declared = {field.name: field.type for field in fields(kind)}
    return {
        field.name: getattr(record, field.name)
        for field in fields(record)
        if declared.get(field.name) == field.type
    }
