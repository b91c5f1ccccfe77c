"""The /metrics scanner on vLLM's real expositions, and on small hand-written bodies."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collectors.parsing import (
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS_PER_SAMPLE,
    VLLM_FAMILIES,
    MalformedExposition,
    Sample,
    exposition,
    parse_cache_config_info,
    parse_vllm_metrics,
)
from tests.conftest import GOLDEN

EXPOSITIONS = GOLDEN / "expositions"
FIXTURES = sorted(EXPOSITIONS.glob("*.txt")) + sorted(EXPOSITIONS.glob("releases/*/*.txt"))

# Counter families kvcap does not read: the scanner's counter rules are checked on them.
PREFIX_CACHE = frozenset({"vllm:prefix_cache_queries", "vllm:prefix_cache_hits"})


def fixture_id(path: Path) -> str:
    return str(path.relative_to(EXPOSITIONS))


def describe(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    return document


def by_engine(samples: list[Sample]) -> dict[str, float]:
    values = {sample.labels["engine"]: sample.value for sample in samples}
    assert len(values) == len(samples), "one series per engine"
    return values


def test_malformed_exposition_is_a_value_error() -> None:
    assert issubclass(MalformedExposition, ValueError)


def test_every_release_is_covered() -> None:
    releases = {path.parent.name for path in FIXTURES if path.parent != EXPOSITIONS}
    assert releases == {"0.10.2", "0.18.1", "0.23.0", "0.24.0", "0.26.0"}
    assert len(FIXTURES) == 33


@pytest.mark.parametrize("path", FIXTURES, ids=fixture_id)
def test_fixture_engines_agree_with_their_json(path: Path) -> None:
    expected = describe(path)
    metrics = parse_vllm_metrics(path.read_text(encoding="utf-8"))
    engines = {str(engine["engine"]): engine for engine in expected["engines"]}

    usage_families = [expected["usage_metric"]]
    if expected.get("also_deprecated_usage_metric"):
        usage_families.append("vllm:gpu_cache_usage_perc")
    for family in usage_families:
        usage = by_engine(metrics[family])
        assert usage == {name: engine["kv_cache_usage"] for name, engine in engines.items()}
    for family in ("num_requests_running", "num_requests_waiting"):
        assert by_engine(metrics[f"vllm:{family}"]) == {
            name: float(engine[family]) for name, engine in engines.items()
        }
    counters = parse_vllm_metrics(path.read_text(encoding="utf-8"), PREFIX_CACHE)
    for family in PREFIX_CACHE:
        assert set(by_engine(counters[family])) == set(engines)
        assert {sample.name for sample in counters[family]} == {family + "_total"}


@pytest.mark.parametrize("path", FIXTURES, ids=fixture_id)
def test_fixture_cache_config_agrees_with_its_json(path: Path) -> None:
    expected = describe(path)
    records = parse_cache_config_info(
        parse_vllm_metrics(path.read_text(encoding="utf-8"))["vllm:cache_config_info"]
    )
    assert [record.engine for record in records] == [
        str(engine["engine"]) for engine in expected["engines"]
    ]
    present = labels_in_text(expected)
    for record in records:
        # Every engine's series repeats the frontend's values: the block count is the sum.
        assert record.num_gpu_blocks == sum(e["num_gpu_blocks"] for e in expected["engines"])
        for key, value in expected["frontend_cache_config"].items():
            label = key.removesuffix("_label")
            if value == "absent" or label not in present:
                assert label not in record.labels
                assert getattr(record, label) is None
            else:
                assert getattr(record, label) == value, label
        assert record.enable_prefix_caching in (True, False)
        assert record.cache_dtype == "auto"


def labels_in_text(expected: dict[str, Any]) -> set[str]:
    """Labels that the derived fixtures kept (their JSON still has the 0.33 values)."""
    everything = {key.removesuffix("_label") for key in expected["frontend_cache_config"]}
    transform = expected.get("transform", "")
    if dropped := re.search(r"dropped labels ([\w,]+)", transform):
        return everything - set(dropped.group(1).split(","))
    if kept := re.search(r"label set reduced to .*?\(([\w,]+)\)", transform):
        return everything & set(kept.group(1).split(","))
    return everything


@pytest.mark.parametrize("path", FIXTURES, ids=fixture_id)
def test_fixture_agrees_with_prometheus_client(path: Path) -> None:
    body = path.read_text(encoding="utf-8")
    reference = [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(body)
        for sample in family.samples
        if sample.name.removesuffix("_total") in VLLM_FAMILIES
    ]
    ours = [
        (sample.name, dict(sample.labels), sample.value)
        for samples in parse_vllm_metrics(body).values()
        for sample in samples
    ]
    assert sorted(map(repr, ours)) == sorted(map(repr, reference))
    assert reference, "the fixture has samples of the families read"


def test_created_samples_are_skipped() -> None:
    body = (EXPOSITIONS / "releases/0.10.2/llama-3.1-8b-dp2-tp1.txt").read_text(encoding="utf-8")
    assert "vllm:prefix_cache_queries_created{" in body
    samples = parse_vllm_metrics(body, PREFIX_CACHE)["vllm:prefix_cache_queries"]
    assert [sample.name for sample in samples] == ["vllm:prefix_cache_queries_total"] * 2


# --- hand-written bodies ----------------------------------------------------------------


def one(body: str, family: str = "vllm:kv_cache_usage_perc") -> Sample:
    (sample,) = parse_vllm_metrics(body)[family]
    return sample


def test_every_requested_family_has_a_key() -> None:
    assert parse_vllm_metrics("") == {family: [] for family in VLLM_FAMILIES}
    assert parse_vllm_metrics("", frozenset({"x"})) == {"x": []}


def test_only_requested_families_are_read() -> None:
    body = 'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:num_requests_running 3\n'
    assert parse_vllm_metrics(body, frozenset({"vllm:num_requests_running"})) == {
        "vllm:num_requests_running": [Sample("vllm:num_requests_running", {}, 3.0)]
    }


def test_label_escapes() -> None:
    sample = one(r'vllm:kv_cache_usage_perc{model_name="a\\b\"c\nd",engine="0"} 1')
    assert sample.labels == {"model_name": 'a\\b"c\nd', "engine": "0"}


@pytest.mark.parametrize(
    ("line", "labels"),
    [
        ('vllm:kv_cache_usage_perc{engine="0",} 1', {"engine": "0"}),
        ("vllm:kv_cache_usage_perc{} 1", {}),
        ("vllm:kv_cache_usage_perc 1", {}),
        ('vllm:kv_cache_usage_perc { engine = "0" , b="}" } 1', {"engine": "0", "b": "}"}),
        ('  vllm:kv_cache_usage_perc{engine="0"} 1', {"engine": "0"}),
        ('vllm:kv_cache_usage_perc{b="x # y",a="{,}"} 1', {"a": "{,}", "b": "x # y"}),
        (
            'vllm:kv_cache_usage_perc{\tengine\t=\t"=,"\t,\t_b9="a=b"\t,\t} 1',
            {"engine": "=,", "_b9": "a=b"},
        ),
        (r'vllm:kv_cache_usage_perc{a="\"}",b="\\",} 1', {"a": '"}', "b": "\\"}),
    ],
)
def test_label_set_shapes(line: str, labels: dict[str, str]) -> None:
    assert one(line).labels == labels


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0.25", 0.25),
        ("1e3", 1000.0),
        ("-1.5E-3", -0.0015),
        ("+Inf", math.inf),
        ("-Inf", -math.inf),
        ("7", 7.0),
        ("0.25 1700000000000", 0.25),
        ("0.25 1700000000.5", 0.25),
        ("0.25\t-5", 0.25),
        ('4 # {trace_id="a"} 1.0 1700000000', 4.0),
        ("0.25 ", 0.25),
    ],
)
def test_values_and_timestamps(text: str, value: float) -> None:
    assert one(f'vllm:kv_cache_usage_perc{{engine="0"}} {text}').value == value


def test_nan() -> None:
    assert math.isnan(one('vllm:kv_cache_usage_perc{engine="0"} NaN').value)


def test_metadata_comments_and_blank_lines_in_any_order() -> None:
    body = "\n".join(
        [
            "# TYPE vllm:kv_cache_usage_perc gauge",
            "",
            '# vllm:kv_cache_usage_perc{engine="9"} 9',
            'vllm:kv_cache_usage_perc{engine="0"} 0.5',
            "# HELP vllm:kv_cache_usage_perc KV-cache usage.",
            "#",
            'vllm:kv_cache_usage_perc{engine="1"} 0.25',
            "",
        ]
    )
    assert by_engine(parse_vllm_metrics(body)["vllm:kv_cache_usage_perc"]) == {
        "0": 0.5,
        "1": 0.25,
    }


def test_openmetrics_eof_ends_the_body() -> None:
    body = (
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{engine="0"} 5.0\n'
        'vllm:prefix_cache_hits_created{engine="0"} 1.7e9\n'
        "# EOF\n"
        'vllm:prefix_cache_hits_total{engine="1"} 6.0 garbage\n'
    )
    assert parse_vllm_metrics(body, PREFIX_CACHE)["vllm:prefix_cache_hits"] == [
        Sample("vllm:prefix_cache_hits_total", {"engine": "0"}, 5.0)
    ]


def test_crlf_line_ends() -> None:
    body = '# TYPE vllm:kv_cache_usage_perc gauge\r\nvllm:kv_cache_usage_perc{engine="0"} 0.5\r\n'
    assert one(body).value == 0.5


def test_first_line_leading_blanks_and_no_final_newline() -> None:
    body = (
        ' vllm:kv_cache_usage_perc{engine="0"} 0.5\r\n'
        '\tvllm:kv_cache_usage_perc{engine="1"} 0.25\r\n'
        'vllm:kv_cache_usage_perc{engine="2"} 0.125'
    )
    samples = parse_vllm_metrics(body)["vllm:kv_cache_usage_perc"]
    assert by_engine(samples) == {"0": 0.5, "1": 0.25, "2": 0.125}
    assert parse_vllm_metrics(f"{body}\n \t# EOF\r\n{MALFORMED['bad float']}") == (
        parse_vllm_metrics(body)
    )


@pytest.mark.parametrize("window_chars", [1, 7, 64, 1000])
def test_a_search_window_edge_loses_no_line(
    window_chars: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body is searched a window at a time (a search holds the interpreter lock): with
    windows of a few characters, edges fall inside, before and after every line, and on
    the blanks before a name; what is read is what one search over the whole body reads."""
    path = EXPOSITIONS / "gemma-3-27b-text-dp2-tp2.vllm-0.33.txt"
    body = path.read_text(encoding="utf-8").replace(
        "\nvllm:kv_cache_usage_perc", "\n \t vllm:kv_cache_usage_perc"
    )
    whole = parse_vllm_metrics(body)
    assert len(whole["vllm:kv_cache_usage_perc"]) == 2
    monkeypatch.setattr(exposition, "SEARCH_WINDOW_CHARS", window_chars)
    assert parse_vllm_metrics(body) == whole
    assert parse_vllm_metrics(f"{body}# EOF\n{MALFORMED['bad float']}") == whole


def test_families_sharing_a_prefix_are_not_read() -> None:
    body = (
        'vllm:num_requests_waiting_by_reason{reason="x"} 1\n'
        "vllm:num_requests_waiting_by_reason{broken\n"
        "vllm:num_requests_waitingX 2\n"
        "vllm:num_requests_waiting 3\n"
    )
    assert one(body, "vllm:num_requests_waiting").value == 3.0


# --- malformed lines --------------------------------------------------------------------

GOOD = 'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5'
MALFORMED = {
    "truncated in labels": 'vllm:kv_cache_usage_perc{engine="0",mod',
    "truncated before value": 'vllm:kv_cache_usage_perc{engine="0"}',
    "name only": "vllm:kv_cache_usage_perc",
    "unterminated quote": 'vllm:kv_cache_usage_perc{engine="0} 0.5',
    "trailing backslash": 'vllm:kv_cache_usage_perc{engine="0\\"} 0.5',
    "bad float": 'vllm:kv_cache_usage_perc{engine="0"} 0.5.1',
    "word as value": 'vllm:kv_cache_usage_perc{engine="0"} high',
    "underscore in value": 'vllm:kv_cache_usage_perc{engine="0"} 1_000',
    "non-ascii digit": 'vllm:kv_cache_usage_perc{engine="0"} \u0661',
    "bad timestamp": 'vllm:kv_cache_usage_perc{engine="0"} 0.5 soon',
    "infinite timestamp": 'vllm:kv_cache_usage_perc{engine="0"} 0.5 +Inf',
    "three fields": 'vllm:kv_cache_usage_perc{engine="0"} 0.5 1 2',
    "bad escape": 'vllm:kv_cache_usage_perc{engine="0\\t"} 0.5',
    "unicode escape": 'vllm:kv_cache_usage_perc{engine="\\u0030"} 0.5',
    "missing comma": 'vllm:kv_cache_usage_perc{engine="0" model_name="m"} 0.5',
    "leading comma": 'vllm:kv_cache_usage_perc{,engine="0"} 0.5',
    "unquoted value": "vllm:kv_cache_usage_perc{engine=0} 0.5",
    "bad label name": 'vllm:kv_cache_usage_perc{0engine="0"} 0.5',
    "duplicate label": 'vllm:kv_cache_usage_perc{engine="0",engine="1"} 0.5',
    "junk after name": "vllm:kv_cache_usage_perc@ 0.5",
    "junk after labels": 'vllm:kv_cache_usage_perc{engine="0"}x 0.5',
}


@pytest.mark.parametrize("line", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_line_of_a_family_read_names_its_line(line: str) -> None:
    body = f"# HELP x y\n{GOOD}\n\n{line}\n{GOOD}\n"
    with pytest.raises(MalformedExposition, match=r"^line 4: vllm:kv_cache_usage_perc: ") as error:
        parse_vllm_metrics(body)
    assert error.value.line_number == 4


@pytest.mark.parametrize("line", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_line_of_another_family_is_ignored(line: str) -> None:
    clean = f"{GOOD}\n"
    for other in ("vllm:kv_cache_usage_perc_by_tier", "vllm:num_preemptions", "other"):
        body = f"{GOOD}\n{line.replace('vllm:kv_cache_usage_perc', other, 1)}\n"
        assert parse_vllm_metrics(body) == parse_vllm_metrics(clean)


def test_malformed_line_after_eof_is_ignored() -> None:
    assert parse_vllm_metrics(f"{GOOD}\n# EOF\n{MALFORMED['bad float']}\n") == parse_vllm_metrics(
        GOOD
    )


@pytest.mark.parametrize(
    ("labels", "reason"),
    [
        (r'a="\q",a="x"', "bad escape"),
        (r'a="x",a="\q"', "bad escape"),
        (r'a="x",a="\n"', "duplicate label a"),
        (r'a="\n",b="x",a="y"', "duplicate label a"),
    ],
)
def test_the_first_fault_in_a_label_set_is_reported(labels: str, reason: str) -> None:
    with pytest.raises(MalformedExposition, match=f": {reason}"):
        parse_vllm_metrics(f"vllm:kv_cache_usage_perc{{{labels}}} 1")


def test_absurd_label_value_is_refused() -> None:
    longest = "x" * MAX_LABEL_VALUE_CHARS
    assert one(f'vllm:kv_cache_usage_perc{{engine="{longest}"}} 1').labels["engine"] == longest
    with pytest.raises(MalformedExposition, match="absurd"):
        parse_vllm_metrics(f'vllm:kv_cache_usage_perc{{engine="{longest}y"}} 1')
    # The limit counts unescaped characters: 4096 escaped backslashes are 4096 characters.
    assert len(one(f'vllm:kv_cache_usage_perc{{a="{chr(92) * 2 * 4096}"}} 1').labels["a"]) == 4096


def test_absurd_label_count_is_refused() -> None:
    def line(count: int) -> str:
        labels = ",".join(f'l{index}="v"' for index in range(count))
        return f"vllm:kv_cache_usage_perc{{{labels}}} 1"

    assert len(one(line(MAX_LABELS_PER_SAMPLE)).labels) == MAX_LABELS_PER_SAMPLE
    with pytest.raises(MalformedExposition, match="absurd"):
        parse_vllm_metrics(line(MAX_LABELS_PER_SAMPLE + 1))
    # Another family may be as absurd as it likes.
    other = line(1000).replace("vllm:kv_cache_usage_perc", "vllm:other")
    assert parse_vllm_metrics(other) == parse_vllm_metrics("")
