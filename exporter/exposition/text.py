"""The Prometheus text formats, byte for byte as prometheus_client writes them.

Sample lines are the same in the 0.0.4 text format and in OpenMetrics 1.0 (labels sorted
by name, values as Go formats floats); only the HELP/TYPE headers of a family differ.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.utils import floatToGoString

# Integers below 2**53 are exact as floats: their repr is their digits and ".0".
_EXACT_INTS = 2**53


def escape_label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_order(labels: Sequence[str]) -> tuple[int, ...]:
    """Positions of `labels` in name order: prometheus_client writes labels sorted."""
    return tuple(sorted(range(len(labels)), key=lambda i: labels[i]))


def sample_prefix(
    name: str, labels: Sequence[str], values: Sequence[str], order: Sequence[int]
) -> str:
    """`name{a="1",b="2"} `: the part of a sample line before its value."""
    if not labels:
        return f"{name} "
    pairs = ",".join(f'{labels[i]}="{escape_label_value(values[i])}"' for i in order)
    return f"{name}{{{pairs}}} "


def sample_value(value: float) -> str:
    """prometheus_client's own formatting of a value (Go's float format)."""
    if type(value) is int and 0 <= value < _EXACT_INTS:
        # Counts and token figures, most values of a body: the same text without the
        # float round trip. Go writes 7 digits and more with an exponent.
        digits = str(value)
        if len(digits) <= 6:
            return digits + ".0"
        return f"{digits[0]}.{digits[1:]}".rstrip("0.") + f"e+{len(digits) - 1:02d}"
    # prometheus_client.utils has no type annotations.
    text: str = floatToGoString(value)  # type: ignore[no-untyped-call]
    return text


def header(name: str, help_text: str, kind: str, *, openmetrics: bool) -> bytes:
    """The # HELP and # TYPE lines of a family (counters: `_total` only in 0.0.4 text)."""
    return header_text(name, help_text, kind, openmetrics=openmetrics).encode()


def header_text(name: str, help_text: str, kind: str, *, openmetrics: bool) -> str:
    if openmetrics:
        escaped = help_text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        return f"# HELP {name} {escaped}\n# TYPE {name} {kind}\n"
    shown = f"{name}_total" if kind == "counter" else name
    escaped = help_text.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {shown} {escaped}\n# TYPE {shown} {kind}\n"


def sample_name(name: str, kind: str) -> str:
    """The name samples of a family carry."""
    return f"{name}_total" if kind == "counter" else name
