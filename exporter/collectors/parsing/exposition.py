"""A targeted scanner of vLLM's `/metrics` text: reads only the few families kvcap needs.

    parse_vllm_metrics(body) -> {"vllm:kv_cache_usage_perc": [Sample(...), ...], ...}

It accepts Prometheus text format 0.0.4 and OpenMetrics 1.0. Lines of every other family
are skipped on a prefix test before anything is parsed, so a malformed line elsewhere in
the body never fails the scrape; a malformed line of a family it reads raises
`MalformedExposition` with the line number.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache

from exporter.errors import MalformedInput

# The families kvcap reads, by their base name (counters without `_total`). The `gpu_*`
# names are the deprecated V1 spellings that 0.10.x still exports next to the new ones.
VLLM_FAMILIES: frozenset[str] = frozenset(
    {
        "vllm:cache_config_info",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_offload_config_info",
    }
)

# Bounds on one sample of a family we read. vLLM's largest series (cache_config_info) has
# about 40 short labels; anything far past that is a broken or hostile peer, and refusing
# it keeps one scrape from holding megabytes of label text.
MAX_LABELS_PER_SAMPLE = 64
MAX_LABEL_VALUE_CHARS = 4096
# Samples of one family: one per engine in every family read (a few per engine with LoRA
# adapters), so 16 per engine at --vllm.max-engines' ceiling. The scan stops there rather
# than build a hundred thousand samples from a hostile body.
MAX_SAMPLES_PER_FAMILY = 16 * 1024

# How much of the body one regex search may cover (about 0.05 ms of C in which no other
# thread runs; see _candidate_lines).
SEARCH_WINDOW_CHARS = 64 * 1024

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# One `name="value"` pair and an optional comma. The value pattern is the unrolled
# form of (non-quote-or-backslash | backslash-anything)*, which the regex engine runs
# without backtracking.
_LABEL_PAIR = re.compile(
    r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"[ \t]*(,?)'
)
_LABELS_END = re.compile(r"[ \t]*}")
# A whole well-formed label set in one match: pairs separated by commas, an optional
# trailing comma. Lines that match take the fast path (the pairs are cut out with string
# calls, or with one findall when there are escapes); any other line goes through the
# pair-by-pair scanner, which says what is wrong.
_PAIR_TEXT = r'[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"[^"\\]*(?:\\.[^"\\]*)*"[ \t]*'
_LABEL_SET = re.compile(rf"(?:{_PAIR_TEXT}(?:,{_PAIR_TEXT})*,?)?[ \t]*}}")
_PAIRS = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"')
_ESCAPE = re.compile(r"\\(.)")
# Both formats allow only these three escapes in label values.
_UNESCAPED = {"\\": "\\", '"': '"', "n": "\n"}
_VALUE_AND_TIMESTAMP = re.compile(r"[ \t]*([^ \t]+)(?:[ \t]+([^ \t]+))?[ \t]*")
# OpenMetrics ends a body with this line, and puts an exemplar after the value (or the
# timestamp) of a counter sample.
_EOF = "# EOF"
_EXEMPLAR_SEPARATOR = " # "


class MalformedExposition(MalformedInput):
    """A line of a family kvcap reads does not follow the exposition format.

    `line_number` is 1-based; it is None for errors found after scanning (a label whose
    value is not the number vLLM always writes there).
    """

    def __init__(
        self, message: str, *, line_number: int | None = None, reason: str = "malformed_exposition"
    ) -> None:
        super().__init__(reason, message)
        self.line_number = line_number


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample: its name as written (`..._total` for counters), labels and value.

    The labels mapping is a plain dict, so a Sample compares by value but is not hashable.
    """

    name: str
    labels: Mapping[str, str]
    value: float


class _BadLine(Exception):
    """Why a line is malformed; the scan loop adds the line number."""


def parse_vllm_metrics(
    body: str, families: frozenset[str] = VLLM_FAMILIES
) -> dict[str, list[Sample]]:
    """Samples of each family in `families`, keyed by family name, in the order of the body.

    Every requested family has a key; its list is empty when the body has no sample of it.
    A counter family `f` collects the samples named `f_total` (and `f`, as 0.0.4 untyped
    text may write it); `f_created` samples are skipped. Text after `# EOF` is ignored.
    """
    sample_families = _sample_families(families)
    found: dict[str, list[Sample]] = {family: [] for family in families}
    for start, line in _candidate_lines(body, families):
        text = line.strip(" \t\r")
        if text == _EOF:
            break
        match = _METRIC_NAME.match(text)
        name = match.group() if match else ""
        # A family's prefix also starts longer names (`..._waiting_by_reason`); those
        # belong to other families and are not looked at.
        family = sample_families.get(name)
        if family is None:
            continue
        try:
            sample = _parse_sample(text, name)
        except _BadLine as reason:
            number = body.count("\n", 0, start) + 1
            raise MalformedExposition(
                f"line {number}: {family}: {reason}: {text[:200]!r}", line_number=number
            ) from None
        samples = found[family]
        samples.append(sample)
        if len(samples) > MAX_SAMPLES_PER_FAMILY:
            raise MalformedExposition(
                f"{family}: more than {MAX_SAMPLES_PER_FAMILY} samples", reason="too_many_samples"
            )
    return found


def _candidate_lines(body: str, families: frozenset[str]) -> Iterator[tuple[int, str]]:
    """(offset, line) of the lines that may hold samples of `families` or `# EOF`.

    A regex search for a newline followed by one of the names runs in C over the whole
    body, so the many lines of other families (histogram buckets, mostly) are never
    split out or looked at one by one. It searches a window of the body at a time: one
    search holds the interpreter lock until it returns, and across the longest run of other
    families in a 64-engine body (2 MiB of histograms) that was 1.3 ms, which a scrape on
    the server's thread waited out.
    """
    first_end = body.find("\n")
    first = body if first_end == -1 else body[:first_end]
    if first.lstrip(" \t").startswith((*families, _EOF)):
        yield 0, first
    pattern = _candidate_pattern(families)
    window_start = 0
    while window_start < len(body):
        # A window ends at a newline, so every candidate line lies wholly in one window
        # (its own newline opens the next).
        window_end = body.find("\n", window_start + SEARCH_WINDOW_CHARS)
        if window_end == -1:
            window_end = len(body)
        for match in pattern.finditer(body, window_start, window_end):
            start = match.start() + 1
            end = body.find("\n", start)
            yield start, body[start:] if end == -1 else body[start:end]
        window_start = window_end


@lru_cache(maxsize=8)
def _candidate_pattern(families: frozenset[str]) -> re.Pattern[str]:
    names = "|".join(re.escape(f) for f in sorted(families, key=len, reverse=True))
    # The names get a group of their own so that the regex compiler moves their common
    # prefix (`vllm:`) out of the alternation. With `# EOF` as one more alternative it
    # cannot, and trying every name at each of the body's ~20k line starts made this
    # search about three times slower.
    return re.compile(rf"\n[ \t]*(?:(?:{names})|{re.escape(_EOF)})")


@lru_cache(maxsize=8)
def _sample_families(families: frozenset[str]) -> dict[str, str]:
    """Sample name -> family name for the sample names that belong to `families`."""
    names: dict[str, str] = {}
    for family in families:
        names[family] = family
        names[family + "_total"] = family
    return names


def _parse_sample(line: str, name: str) -> Sample:
    """The sample on `line`, which starts with the metric name `name`."""
    position = len(name)
    while line.startswith((" ", "\t"), position):
        position += 1
    labels: dict[str, str] = {}
    if line.startswith("{", position):
        labels, position = _scan_labels(line, position + 1)
    elif position == len(name) < len(line):
        raise _BadLine(f"unexpected {line[position]!r} after the metric name")
    return Sample(name=name, labels=labels, value=_scan_value(line[position:]))


def _scan_labels(line: str, position: int) -> tuple[dict[str, str], int]:
    """Labels from just after `{`; returns them and the position just after `}`."""
    whole = _LABEL_SET.match(line, position)
    if whole is None:
        return _scan_labels_one_by_one(line, position)
    end = whole.end()
    label_set = line[position:end]
    escaped = "\\" in label_set
    if escaped:
        pairs = _PAIRS.findall(label_set)
    else:
        # The label set is well formed and has no backslash, so every quote opens or
        # closes a value: the pieces alternate between a name (with the blanks, comma and
        # `=` around it) and a value. Cheaper than a second regex pass over what can be a
        # kilobyte of cache_config_info labels.
        pieces = label_set.split('"')
        names = [piece.strip(" \t,=") for piece in pieces[0:-1:2]]
        pairs = list(zip(names, pieces[1::2], strict=True))
    labels = dict(pairs)
    if len(labels) != len(pairs) or len(labels) > MAX_LABELS_PER_SAMPLE:
        # A duplicate or too many labels: the careful path says which, at the right pair.
        return _scan_labels_one_by_one(line, position)
    if escaped:
        labels = {label: _ESCAPE.sub(_unescape, value) for label, value in pairs}
    # No value is longer than the label set it sits in, so short sets skip the check.
    if end - position > MAX_LABEL_VALUE_CHARS and labels:
        label = max(labels, key=lambda name: len(labels[name]))
        if len(labels[label]) > MAX_LABEL_VALUE_CHARS:
            raise _BadLine(f"absurd label: {label} is {len(labels[label])} characters long")
    return labels, end


def _scan_labels_one_by_one(line: str, position: int) -> tuple[dict[str, str], int]:
    """The careful path: pair by pair, so a malformed label set is reported precisely."""
    labels: dict[str, str] = {}
    while True:
        pair = _LABEL_PAIR.match(line, position)
        if pair is None:
            end = _LABELS_END.match(line, position)
            if end is None:
                raise _BadLine(f"bad label or unterminated label set at column {position + 1}")
            return labels, end.end()
        label, raw_value, comma = pair.groups()
        value = _ESCAPE.sub(_unescape, raw_value) if "\\" in raw_value else raw_value
        if len(value) > MAX_LABEL_VALUE_CHARS:
            raise _BadLine(f"absurd label: {label} is {len(value)} characters long")
        if label in labels:
            raise _BadLine(f"duplicate label {label}")
        labels[label] = value
        if len(labels) > MAX_LABELS_PER_SAMPLE:
            raise _BadLine(f"absurd label set: more than {MAX_LABELS_PER_SAMPLE} labels")
        position = pair.end()
        if not comma:
            end = _LABELS_END.match(line, position)
            if end is None:
                raise _BadLine(f"expected ',' or '}}' at column {position + 1}")
            return labels, end.end()


def _unescape(escape: re.Match[str]) -> str:
    try:
        return _UNESCAPED[escape.group(1)]
    except KeyError:
        raise _BadLine(f"bad escape {escape.group()!r} in a label value") from None


def _scan_value(text: str) -> float:
    """The value from the text after the labels; a timestamp is checked, then dropped."""
    text = text.partition(_EXEMPLAR_SEPARATOR)[0]
    fields = _VALUE_AND_TIMESTAMP.fullmatch(text)
    if fields is None:
        raise _BadLine("expected a value and an optional timestamp")
    value_text, timestamp_text = fields.groups()
    value = _parse_number(value_text, "value")
    if timestamp_text is not None and not math.isfinite(_parse_number(timestamp_text, "timestamp")):
        raise _BadLine(f"bad timestamp {timestamp_text!r}")
    return value


def _parse_number(text: str, what: str) -> float:
    # float() also takes `1_000` and non-ASCII digits, which neither format allows.
    if "_" in text or not text.isascii():
        raise _BadLine(f"bad {what} {text!r}")
    try:
        return float(text)
    except ValueError:
        raise _BadLine(f"bad {what} {text!r}") from None
