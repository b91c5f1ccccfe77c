"""The publisher's sequence numbers: in order, a gap, or a new publisher (pure).

vLLM numbers each batch of one publisher 0, 1, 2, ... and never repeats a number, so a
number at or below the last one seen means a new publisher: the engine restarted.
"""

from __future__ import annotations

from enum import Enum


class Step(Enum):
    NEXT = "next"  # the batch after the last one
    START = "start"  # the first batch seen, and the publisher's first (sequence 0)
    JOINED = "joined"  # the first batch seen, later than the publisher's first
    GAP = "gap"  # batches between the last one and this one are missing
    RESTART = "restart"  # a new publisher (sequence went back)


def classify(last: int | None, sequence: int) -> Step:
    if last is None:
        return Step.START if sequence == 0 else Step.JOINED
    if sequence == last + 1:
        return Step.NEXT
    if sequence <= last:
        return Step.RESTART
    return Step.GAP


def missing_from(last: int | None, sequence: int) -> int | None:
    """The first sequence number to ask the replay endpoint for, if any are missing
    before `sequence`."""
    step = classify(last, sequence)
    if step is Step.GAP and last is not None:
        return last + 1
    if step in (Step.JOINED, Step.RESTART) and sequence > 0:
        return 0
    return None
