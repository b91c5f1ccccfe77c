"""vLLM /metrics bodies: samples or MalformedExposition, and reports the exporter can serve.

Three layers, each on arbitrary text and on recorded vLLM bodies (0.10.2 to 0.33) with
their lines and label values broken:
- parse_vllm_metrics: the scanner;
- parse_cache_config_info: typed `vllm:cache_config_info` labels;
- read_server -> StateStore -> /metrics: what the vllm_http poller does with one body.
  Anything but MalformedExposition escaping read_server stops the poller thread.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families
from structlog.testing import capture_logs

from exporter.collectors import Deriver, ServerDocuments, ServerReading, cached_deriver, read_server
from exporter.collectors.parsing import (
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS_PER_SAMPLE,
    VLLM_FAMILIES,
    CacheConfigInfo,
    MalformedExposition,
    Sample,
    parse_cache_config_info,
    parse_vllm_metrics,
    parse_vllm_serve_args,
)
from exporter.exposition import build_exposition
from exporter.model_config import load_model_config
from exporter.state import StateStore
from tests.conftest import GOLDEN
from tests.fuzz.mutations import garbage, mutated

EXPOSITIONS = GOLDEN / "expositions"


def _recordings() -> list[tuple[str, str, dict[str, Any], Path]]:
    found = []
    for path in sorted([*EXPOSITIONS.glob("*.json"), *EXPOSITIONS.glob("releases/*/*.json")]):
        fixture = json.loads(path.read_text(encoding="utf-8"))
        name = fixture.get("exposition_file") or path.with_suffix(".txt").name
        body = (path.parent / Path(name).name).read_text(encoding="utf-8")
        found.append((str(path.relative_to(EXPOSITIONS)), body, fixture, path))
    return found


RECORDINGS = _recordings()
RECORDING = {recording[0]: recording for recording in RECORDINGS}
BODIES = {name: body for name, body, _, _ in RECORDINGS}
_DERIVERS: dict[Path, Deriver] = {}


def deriver_for(fixture: dict[str, Any], path: Path) -> Deriver:
    config_dir = (path.parent / fixture["model_config_dir"]).resolve()
    if config_dir not in _DERIVERS:
        _DERIVERS[config_dir] = cached_deriver(load_model_config(config_dir))
    return _DERIVERS[config_dir]


# Label values vLLM never writes, or writes differently.
LABEL_VALUES = st.sampled_from(
    [
        "",
        "None",
        "0",
        "-1",
        "-134276",
        "1",
        "3",
        "16.0",
        "16.5",
        "1e300",
        "1e400",
        "nan",
        "inf",
        "-inf",
        "True",
        "true",
        "fp8",
        "x" * (MAX_LABEL_VALUE_CHARS + 1),
        "9" * 5000,
        "\u0663",  # ARABIC-INDIC DIGIT THREE: str.isdigit() and int() agree
        "\u00b2",  # SUPERSCRIPT TWO: str.isdigit() is true, int() refuses it
        "\\n",
        '\\"',
        "\\\\",
        "\\x",
        "0x10",
        "1_000",
    ]
) | st.text(
    # The poller decodes bodies as strict UTF-8: no lone surrogates in a label value.
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters='"\\\n'),
    max_size=8,
)
LINE_PIECES = st.sampled_from(
    [
        "{",
        "}",
        '"',
        "\\",
        ",",
        "=",
        " ",
        "\t",
        "\n",
        "\r",
        "#",
        " # EOF\n",
        "# EOF",
        "NaN",
        "+Inf",
        "1e999",
        "_total",
        'engine="0"',
        'engine="1",',
        'engine="\u00b2"',
        ',engine="0"',
        "vllm:cache_config_info",
        "vllm:kv_cache_usage_perc",
        "\x00",
        "\ufeff",
    ]
) | st.text(max_size=4)
_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def read_lines(lines: list[str]) -> list[int]:
    """Indexes of the lines of the families kvcap reads."""
    return [index for index, line in enumerate(lines) if line.startswith(tuple(VLLM_FAMILIES))]


class MutatedBody(str):
    """A mutated recording whose repr names the recording and the edits, not 80 kB of text."""

    recording: str
    edits: tuple[str, ...]

    def __new__(cls, text: str, recording: str, edits: tuple[str, ...]) -> MutatedBody:
        body = super().__new__(cls, text)
        body.recording = recording
        body.edits = edits
        return body

    def __repr__(self) -> str:
        return f"MutatedBody(recording={self.recording!r}, edits={self.edits!r})"


@st.composite
def mutated_bodies(draw: st.DrawFn, bodies: dict[str, str] = BODIES) -> MutatedBody:
    """A recorded body with label values replaced and lines edited, cut or repeated."""
    name = draw(st.sampled_from(sorted(bodies)))
    lines = bodies[name].split("\n")
    edits = []
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        targets = read_lines(lines) or [0]
        index = draw(st.sampled_from(targets)) if draw(st.integers(0, 4)) else None
        index = draw(st.integers(0, len(lines) - 1)) if index is None else index
        line = lines[index]
        operation = draw(st.sampled_from(["label", "label", "edit", "cut", "repeat", "drop"]))
        pairs = list(_PAIR.finditer(line))
        if operation == "label" and pairs:
            pair = draw(st.sampled_from(pairs))
            value = draw(LABEL_VALUES)
            lines[index] = f"{line[: pair.start(2)]}{value}{line[pair.end(2) :]}"
            edits.append(f"line {index + 1}: {pair.group(1)}={value[:40]!r}")
        elif operation == "edit":
            at = draw(st.integers(0, len(line)))
            piece = draw(LINE_PIECES)
            lines[index] = line[:at] + piece + line[at:]
            edits.append(f"line {index + 1}: insert {piece!r} at column {at + 1}")
        elif operation == "cut":
            at = draw(st.integers(0, len(line)))
            lines[index] = line[:at]
            edits.append(f"line {index + 1}: cut at column {at + 1}")
        elif operation == "repeat":
            lines.insert(index, line)
            edits.append(f"line {index + 1}: repeated")
        elif operation == "drop" and len(lines) > 1:
            del lines[index]
            edits.append(f"line {index + 1}: dropped")
    return MutatedBody("\n".join(lines), name, tuple(edits))


def check_samples(found: dict[str, list[Sample]]) -> None:
    assert set(found) == set(VLLM_FAMILIES)
    for family, samples in found.items():
        for sample in samples:
            assert sample.name in (family, f"{family}_total")
            assert isinstance(sample.value, float)
            assert len(sample.labels) <= MAX_LABELS_PER_SAMPLE
            assert all(len(value) <= MAX_LABEL_VALUE_CHARS for value in sample.labels.values())


def check_infos(infos: list[CacheConfigInfo]) -> None:
    assert len({info.engine for info in infos}) == len(infos)
    for info in infos:
        for name in ("num_gpu_blocks", "block_size", "kv_cache_size_tokens", "sliding_window"):
            value = getattr(info, name)
            assert value is None or type(value) is int, (name, value)
        assert info.enable_prefix_caching in (None, True, False)


def scan(body: str) -> tuple[dict[str, list[Sample]], list[CacheConfigInfo]] | None:
    """Samples and cache_config_info records, or None when refused as malformed."""
    try:
        samples = parse_vllm_metrics(body)
        infos = parse_cache_config_info(samples["vllm:cache_config_info"])
    except MalformedExposition:
        return None
    check_samples(samples)
    check_infos(infos)
    return samples, infos


@given(body=st.text())
def test_arbitrary_text(body: str) -> None:
    scan(body)


@given(
    body=st.lists(
        st.sampled_from(sorted(VLLM_FAMILIES)) | LINE_PIECES | LABEL_VALUES, max_size=30
    ).map("".join)
)
def test_exposition_like_text(body: str) -> None:
    scan(body)


@given(body=mutated_bodies())
def test_mutated_recorded_bodies(body: str) -> None:
    scan(body)


CACHE_LABELS = st.sampled_from(
    [
        "engine",
        "num_gpu_blocks",
        "block_size",
        "kv_cache_size_tokens",
        "kv_cache_max_concurrency",
        "gpu_memory_utilization",
        "cache_dtype",
        "enable_prefix_caching",
        "sliding_window",
        "mamba_block_size",
        "user_specified_block_size",
        "kv_cache_memory_bytes",
    ]
) | st.text(max_size=4)


@given(
    labels=st.dictionaries(CACHE_LABELS, LABEL_VALUES, max_size=8),
    repeat=st.integers(min_value=1, max_value=3),
)
def test_cache_config_info_of_arbitrary_labels(labels: dict[str, str], repeat: int) -> None:
    samples = [Sample("vllm:cache_config_info", labels, 1.0)] * repeat
    try:
        infos = parse_cache_config_info(samples)
    except MalformedExposition as error:
        refusal = str(error)
    else:
        check_infos(infos)
        assert len(infos) == 1
        return
    assert "vllm:cache_config_info" in refusal  # it names the family and the label


# --- the poller's whole path: read_server, the store, the rendered /metrics -------------


def read(documents: ServerDocuments, fixture: dict[str, Any], path: Path) -> ServerReading | None:
    args = parse_vllm_serve_args(fixture["vllm_args"])
    try:
        return read_server(documents, args, deriver_for(fixture, path))
    except MalformedExposition:
        return None


def serve_and_parse(reading: ServerReading) -> None:
    """Publish the reports and render /metrics in both formats; both must parse."""
    store = StateStore()
    with capture_logs():  # one "engine_added" line per engine and example is noise here
        store.publish("vllm_http", "http://vllm:8000", reading.reports)
    cache = build_exposition(store.snapshot, process=False)
    try:
        text = cache.body().content.decode("utf-8")
    except UnicodeEncodeError as error:
        # test_a_lone_surrogate_from_json_breaks_no_scrape: JSON's "\ud800" escapes.
        if "surrogates not allowed" not in str(error):
            raise
        return
    for family in text_families(text):
        if family.name == "kvcap_kv_cache_capacity_tokens":
            assert all(sample.value == int(sample.value) for sample in family.samples)
    openmetrics = cache.body(accept="application/openmetrics-text").content.decode("utf-8")
    # prometheus_client's OpenMetrics parser has no type annotations.
    list(openmetrics_families(openmetrics))  # type: ignore[no-untyped-call]


def check_reading(reading: ServerReading) -> None:
    engines = [report.engine for report in reading.reports]
    assert len(set(engines)) == len(engines)
    for report in reading.reports:
        assert report.engine
        if report.reported is not None:
            blocks = report.reported.num_gpu_blocks
            assert blocks is None or type(blocks) is int
        if report.derived is not None:
            assert report.derivation_error is None
            derived = report.derived
            assert derived.kv_cache_max_concurrency is not None
            assert derived.max_model_len is not None
            assert derived.kv_cache_size_tokens == int(
                derived.kv_cache_max_concurrency * derived.max_model_len
            )
            assert math.isfinite(derived.kv_cache_max_concurrency)


@st.composite
def server_documents(draw: st.DrawFn) -> tuple[ServerDocuments, str]:
    """What one poll of a recorded server returns, broken, and the recording's name."""
    name = draw(st.sampled_from(sorted(BODIES)))
    _, body, fixture, _ = RECORDING[name]
    body = draw(mutated_bodies({name: body}))
    models = fixture["v1_models"]
    if draw(st.booleans()):
        models = draw(mutated(models, keys=("max_model_len", "root", "id", "data")))
    version = draw(st.sampled_from([fixture["version"], {}, {"version": None}]) | garbage)
    documents = ServerDocuments(
        metrics=body,
        models=models if isinstance(models, dict) else None,
        version=version if isinstance(version, dict) else None,
    )
    return documents, name


# Expensive (a poll, a derivation and two renders: ~25 ms an example), so the long profile
# runs it 2,000 times rather than 20,000; the default profile's budget is unchanged.
@settings(
    max_examples=min(settings().max_examples, 2_000),
    suppress_health_check=[HealthCheck.too_slow],
)
@given(inputs=server_documents())
def test_a_mutated_server_gives_reports_the_exporter_serves(
    inputs: tuple[ServerDocuments, str],
) -> None:
    documents, name = inputs
    _, _, fixture, path = RECORDING[name]
    reading = read(documents, fixture, path)
    if reading is not None:
        check_reading(reading)
        serve_and_parse(reading)


@pytest.mark.parametrize("name", sorted(BODIES))
def test_every_recorded_server_is_served(name: str) -> None:
    _, body, fixture, path = RECORDING[name]
    reading = read(ServerDocuments(body, fixture["v1_models"], fixture["version"]), fixture, path)
    assert reading is not None
    assert reading.reports
    check_reading(reading)
    serve_and_parse(reading)


# --- the bugs the fuzzer found, minimal inputs ------------------------------------------


def test_an_engine_label_that_isdigit_but_not_int() -> None:
    body = 'vllm:num_requests_running{engine="\u00b2",model_name="m"} 1\n'
    try:
        read_server(ServerDocuments(body), None, None)
    except MalformedExposition:
        return  # refusing the body is as good as reading it


def _never_called(settings: object, blocks: int) -> Any:
    raise AssertionError("the capacity model should not be asked")


@pytest.mark.parametrize("max_model_len", [0, -5, False], ids=["zero", "negative", "false"])
def test_a_max_model_len_of_zero_in_v1_models(max_model_len: Any) -> None:
    body = 'vllm:cache_config_info{engine="0",num_gpu_blocks="1000"} 1\n'
    models = {"data": [{"id": "m", "max_model_len": max_model_len}]}
    reading = read_server(
        ServerDocuments(body, models), parse_vllm_serve_args("/models/m"), _never_called
    )
    assert reading.reports[0].derivation_error


def test_a_boolean_max_model_len_is_not_a_length() -> None:
    body = 'vllm:cache_config_info{engine="0",num_gpu_blocks="1000"} 1\n'
    models = {"data": [{"id": "m", "max_model_len": True}]}
    reading = read_server(ServerDocuments(body, models), None, None)
    reported = reading.reports[0].reported
    assert reported is not None
    assert reported.max_model_len is None
