"""The /metrics scanner against prometheus_client's parsers, on generated expositions.

Each example is a whole body in one of the two formats: vLLM's families mixed with
look-alike and random ones, label values full of characters that need escapes, HELP and
TYPE in either order, timestamps, exemplars and special floats. The scanner must return
exactly the samples prometheus_client finds for the families it reads.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families

from exporter.collectors.parsing import VLLM_FAMILIES, MalformedExposition, parse_vllm_metrics

# kvcap reads no counter family; the scanner's counter rules (`_total`, `_created`) are
# checked on two it could read.
COUNTERS = frozenset({"vllm:prefix_cache_queries", "vllm:prefix_cache_hits"})
READ = VLLM_FAMILIES | COUNTERS
# Families whose names start with a family kvcap reads; the scanner must pass them by.
LOOK_ALIKES = {
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:kv_cache_usage_perc_by_tier": "gauge",
    "vllm:external_prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits_ratio": "gauge",
}
EXEMPLAR = ' # {trace_id="4bf92f3577b34da6"} 1.0 1520879607.789'


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    value: str  # as written
    timestamp: str | None
    exemplar: bool


@dataclass(frozen=True)
class Family:
    name: str  # counters without _total
    kind: str  # gauge | counter | untyped
    help: str | None
    has_type: bool
    type_first: bool
    series: list[Series]
    created: bool  # counters: also write `_created` samples


# Built from characters rather than st.from_regex, which is several times slower.
label_names = st.builds(
    str.__add__,
    st.sampled_from(string.ascii_letters),
    st.text(alphabet=string.ascii_letters + string.digits + "_", max_size=8),
)
label_values = st.one_of(
    st.text(alphabet=st.sampled_from('ab\\"\n{}=, #\t\u00e9\u2028\r'), max_size=12),
    st.text(max_size=12),
)
help_texts = st.builds(
    str.__add__,
    st.sampled_from(string.ascii_letters),
    st.text(alphabet=string.ascii_letters + " .,:;()'{}=#-", max_size=30),
)


@st.composite
def numbers(draw: st.DrawFn, *, counter: bool) -> str:
    """A value as an exposition may write it; counters are never negative or NaN."""
    specials = ["+Inf"] if counter else ["+Inf", "-Inf", "NaN"]
    number = draw(
        st.floats(min_value=0 if counter else None, allow_nan=False, allow_infinity=False, width=64)
    )
    form = draw(st.sampled_from(["repr", "e", "E", "int", "special"]))
    if form == "special":
        return draw(st.sampled_from(specials))
    if form == "int":
        return str(draw(st.integers(min_value=0 if counter else -(10**12), max_value=10**12)))
    return {"repr": repr(number), "e": f"{number:e}", "E": f"{number:.3E}"}[form]


@st.composite
def families(draw: st.DrawFn, *, openmetrics: bool) -> list[Family]:
    chosen = draw(st.sets(st.sampled_from(sorted(READ)), min_size=1))
    kinds = {name: "counter" if name in COUNTERS else "gauge" for name in chosen}
    for name in draw(st.sets(st.sampled_from(sorted(LOOK_ALIKES)))):
        kinds[name] = LOOK_ALIKES[name]
    others = st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=6)
    for name in draw(st.sets(others.map("app_".__add__), max_size=3)):
        kinds[name] = draw(st.sampled_from(["gauge", "counter", "untyped"]))
    stamped = draw(st.booleans())
    result = []
    for name in draw(st.permutations(sorted(kinds))):
        kind = kinds[name]
        label_sets = draw(
            st.lists(
                st.dictionaries(label_names, label_values, max_size=5),
                max_size=4,
                unique_by=lambda labels: tuple(sorted(labels.items())),
            )
        )
        series = [
            Series(
                labels=labels,
                value=draw(numbers(counter=openmetrics and kind == "counter")),
                timestamp=draw(timestamps(openmetrics)) if stamped else None,
                exemplar=openmetrics and kind == "counter" and draw(st.booleans()),
            )
            for labels in label_sets
        ]
        result.append(
            Family(
                name=name,
                kind=kind,
                help=draw(st.none() | help_texts),
                # OpenMetrics needs TYPE for a counter's _total suffix.
                has_type=kind == "counter" or draw(st.booleans()),
                type_first=draw(st.booleans()),
                series=series,
                created=kind == "counter" and draw(st.booleans()),
            )
        )
    return result


def timestamps(openmetrics: bool) -> st.SearchStrategy[str]:
    milliseconds = st.integers(min_value=0, max_value=2 * 10**12).map(str)
    if not openmetrics:
        return milliseconds
    return st.one_of(
        st.integers(min_value=0, max_value=2 * 10**9).map(str),
        st.decimals(min_value=0, max_value=2 * 10**9, places=3).map(str),
    )


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_text(labels: dict[str, str], trailing_comma: bool) -> str:
    if not labels:
        return ""
    pairs = ",".join(f'{name}="{escape(value)}"' for name, value in labels.items())
    return "{" + pairs + ("," if trailing_comma else "") + "}"


def metadata(family: Family, name: str, typ: str) -> list[str]:
    lines = [f"# HELP {name} {family.help}"] if family.help is not None else []
    if family.has_type:
        type_line = f"# TYPE {name} {typ}"
        lines = [type_line, *lines] if family.type_first else [*lines, type_line]
    return lines


@st.composite
def text_bodies(draw: st.DrawFn) -> str:
    """Prometheus text format 0.0.4, written as prometheus_client writes it, plus noise."""
    lines: list[str] = []
    for family in draw(families(openmetrics=False)):
        name = family.name + "_total" if family.kind == "counter" else family.name
        lines += metadata(family, name, family.kind)
        for series in family.series:
            indent = draw(st.sampled_from(["", "", "  ", "\t"]))
            labels = label_text(series.labels, trailing_comma=draw(st.booleans()))
            stamp = f" {series.timestamp}" if series.timestamp else ""
            lines.append(f"{indent}{name}{labels} {series.value}{stamp}")
        if family.created:
            # prometheus_client writes a counter's creation time as a gauge family.
            lines.append(f"# TYPE {family.name}_created gauge")
            lines += [
                f"{family.name}_created{label_text(series.labels, False)} 1.7e9"
                for series in family.series
            ]
    noise = ["", "#", "# a comment", '# vllm:kv_cache_usage_perc{engine="9"} 9']
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        lines.insert(draw(st.integers(0, len(lines))), draw(st.sampled_from(noise)))
    return "\n".join(lines) + draw(st.sampled_from(["", "\n"]))


@st.composite
def openmetrics_bodies(draw: st.DrawFn) -> str:
    """OpenMetrics 1.0: counters as `_total` (+ `_created`), exemplars, `# EOF`."""
    lines: list[str] = []
    for family in draw(families(openmetrics=True)):
        typ = "unknown" if family.kind == "untyped" else family.kind
        lines += metadata(family, family.name, typ)
        for series in family.series:
            labels = label_text(series.labels, trailing_comma=False)
            stamp = f" {series.timestamp}" if series.timestamp else ""
            if family.kind != "counter":
                lines.append(f"{family.name}{labels} {series.value}{stamp}")
                continue
            exemplar = EXEMPLAR if series.exemplar else ""
            lines.append(f"{family.name}_total{labels} {series.value}{stamp}{exemplar}")
            if family.created:
                lines.append(f"{family.name}_created{labels} 1.7e9{stamp}")
    return "\n".join([*lines, "# EOF"]) + draw(st.sampled_from(["", "\n"]))


def comparable(name: str, labels: Mapping[str, str], value: float) -> str:
    return repr((name, sorted(labels.items()), "nan" if math.isnan(value) else float(value)))


def scanned(body: str) -> list[str]:
    return sorted(
        comparable(sample.name, sample.labels, sample.value)
        for samples in parse_vllm_metrics(body, READ).values()
        for sample in samples
    )


def reference(body: str, *, openmetrics: bool) -> list[str]:
    parse = openmetrics_families if openmetrics else text_families
    return sorted(
        comparable(sample.name, sample.labels, sample.value)
        for family in parse(body)
        for sample in family.samples
        if sample.name.removesuffix("_total") in READ
    )


PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(body=text_bodies())
def test_text_format_agrees_with_prometheus_client(body: str) -> None:
    assert scanned(body) == reference(body, openmetrics=False)


@PROPERTY
@given(body=openmetrics_bodies())
def test_openmetrics_agrees_with_prometheus_client(body: str) -> None:
    assert scanned(body) == reference(body, openmetrics=True)


@PROPERTY
@given(body=st.one_of(text_bodies(), openmetrics_bodies()), data=st.data())
def test_truncating_a_label_set_fails_only_in_a_family_read(body: str, data: st.DataObject) -> None:
    lines = body.split("\n")
    # Samples with a label set (an exemplar's braces come after it).
    label_sets = {
        index: line.split(EXEMPLAR)[0]
        for index, line in enumerate(lines)
        if "{" in line.split(EXEMPLAR)[0] and not line.startswith("#")
    }
    if not label_sets:
        return
    index = data.draw(st.sampled_from(sorted(label_sets)))
    line = lines[index]
    cut = data.draw(st.integers(line.index("{") + 1, label_sets[index].rindex("}")))
    broken = "\n".join([*lines[:index], line[:cut], *lines[index + 1 :]])
    name = line.strip().partition("{")[0]
    if name.removesuffix("_total") in READ:
        with pytest.raises(MalformedExposition) as error:
            parse_vllm_metrics(broken, READ)
        assert error.value.line_number == index + 1
    else:
        assert scanned(broken) == scanned(body)
