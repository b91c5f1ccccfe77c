"""docs/reliability.md's budget table names only flags kvcap has and reasons the code declares,
and the code counts only reasons it declares (exporter/counted_reasons.py), so neither drifts."""

from __future__ import annotations

import argparse
import ast
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.cli import build_parser
from exporter.collectors import COLLECTORS, FetchError, fetch
from exporter.counted_reasons import COLLECTOR_ERROR_REASONS, COUNTED_REASONS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reliability.md"
COUNTED = re.compile(r'`(kvcap_[a-z_]+_total)\{reason="([a-z0-9_]+)"\}`')
FLAG = re.compile(r"`(--[a-z0-9][a-z0-9.-]*)`")


def budget_rows() -> list[list[str]]:
    """The cells of each row of the "Budget table" section (header and rule left out)."""
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("\n### Budget table\n", 1)[1].split("\n### ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[2:]]


ROWS = budget_rows()


def command_flags(command: str) -> set[str]:
    """Every option string of `kvcap-exporter COMMAND --help`."""
    parser, _ = build_parser(command)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            sub = action.choices[command]
            return {option for each in sub._actions for option in each.option_strings}
    raise AssertionError(f"no {command} command")


def test_the_table_is_at_the_top_of_hostile_input_and_covers_every_interface() -> None:
    text = PAGE.read_text(encoding="utf-8")
    hostile = text.index("\n## Hostile input\n")
    assert text.index("\n### ", hostile) == text.index("\n### Budget table\n")
    inputs = " ".join(row[0] for row in ROWS)
    for interface in ("HTTP", "web config", "vLLM API", "handshake", "KV events", "capacity"):
        assert interface in inputs
    assert len(ROWS) >= 40


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_each_row_has_a_default_a_flag_or_fixed_and_a_count(row: list[str]) -> None:
    assert len(row) == 5, row
    _, bound, _, flag, counted = row
    assert bound or row[2], "a row says what it bounds or its default"
    assert flag == "fixed" or FLAG.search(flag), f"flag column: {flag!r}"
    assert counted, "counted as: a reason, or - when nothing is counted"


def test_every_flag_the_table_names_is_a_flag_of_kvcap() -> None:
    known = command_flags("serve") | command_flags("capacity")
    named = {flag for row in ROWS for flag in FLAG.findall(row[3])}
    assert named, "the table names flags"
    assert named <= known, sorted(named - known)


def test_every_reason_the_table_names_is_declared() -> None:
    named = [match.groups() for row in ROWS for match in COUNTED.finditer(row[4])]
    assert len(named) >= 30
    undeclared = [(c, r) for c, r in named if r not in COUNTED_REASONS.get(c, frozenset())]
    assert not undeclared


def test_every_cell_counted_names_a_counter_kvcap_has() -> None:
    for row in ROWS:
        for counter in re.findall(r"kvcap_[a-z_]+_total", row[4]):
            assert counter in COUNTED_REASONS, counter


# Where the source passes a reason: (call name, argument position), a keyword `reason=`,
# a parameter `reason` with a default, and what a function named *_reason returns.
COLLECTOR_CALLS = {
    "FetchError": 0,
    "Refused": 0,
    "FileRefused": 0,
    "CollectorError": 0,
    "_failed": 0,
}
SINK_CALLS = {"fail": 2, "reject": 2}
WEB_CALLS = {"_refuse": 1, "BadHead": 1}


def _strings(node: ast.AST | None) -> Iterator[str]:
    """The string constants `node` can evaluate to (a constant, either arm of an if)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)


def _name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")


def _is_log(call: ast.Call) -> bool:
    """A structlog call (`log.info(..., reason=...)`): its reason is a field of a log line."""
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in {"log", "_log"}
    )


def _argument(call: ast.Call, position: int) -> ast.expr | None:
    return call.args[position] if len(call.args) > position else None


def reasons_in_source(folder: Path, pattern: str = "*.py") -> Iterator[tuple[str, str, str]]:
    """(counter kind, reason, where) for every literal reason the code under `folder` passes."""
    for path in sorted(folder.rglob(pattern) if pattern == "*.py" else folder.glob(pattern)):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                yield from ((kind, r, where) for kind, r in _call_reasons(node))
            elif isinstance(node, ast.FunctionDef):
                yield from ((kind, r, where) for kind, r in _function_reasons(node))


def _call_reasons(call: ast.Call) -> Iterator[tuple[str, str]]:
    name = _name(call)
    for keyword in call.keywords:
        if keyword.arg == "reason" and not _is_log(call):
            yield from (("collector", r) for r in _strings(keyword.value))
    if name in COLLECTOR_CALLS:
        yield from (("collector", r) for r in _strings(_argument(call, COLLECTOR_CALLS[name])))
    elif name in SINK_CALLS and len(call.args) > SINK_CALLS[name]:
        yield from (("collector", r) for r in _strings(_argument(call, SINK_CALLS[name])))
    elif name == "reject" and len(call.args) == 1:  # WebCounters.reject(reason)
        yield from (("web", r) for r in _strings(call.args[0]))
    elif name in WEB_CALLS:
        yield from (("web", r) for r in _strings(_argument(call, WEB_CALLS[name])))
    elif name == "reload_failed":
        yield from (("reload", r) for r in _strings(_argument(call, 0)))
    elif name == "_hit":  # Residency._hit(reason): a bound hit, counted
        yield from (("collector", r) for r in _strings(_argument(call, 0)))
    elif name == "drop":
        yield from (("dropped", r) for r in _strings(_argument(call, 0)))


def _function_reasons(function: ast.FunctionDef) -> Iterator[tuple[str, str]]:
    arguments = function.args
    defaults: dict[ast.arg, ast.expr | None] = dict(
        zip(reversed(arguments.args), reversed(arguments.defaults), strict=False)
    )
    defaults |= dict(zip(arguments.kwonlyargs, arguments.kw_defaults, strict=True))
    for argument, default in defaults.items():
        if argument.arg == "reason":
            yield from (("collector", r) for r in _strings(default))
    if function.name.endswith("_reason"):
        for node in ast.walk(function):
            if isinstance(node, ast.Return):
                yield from (("collector", r) for r in _strings(node.value))


DECLARED = {
    "collector": COUNTED_REASONS["kvcap_collector_errors_total"],
    "dropped": COUNTED_REASONS["kvcap_kv_events_dropped_total"],
    "web": COUNTED_REASONS["kvcap_web_requests_rejected_total"],
    "reload": COUNTED_REASONS["kvcap_web_config_reload_errors_total"],
}
SOURCE = [
    *reasons_in_source(ROOT / "exporter" / "collectors"),
    *reasons_in_source(ROOT / "exporter" / "prefix_cache"),
    *reasons_in_source(ROOT / "exporter" / "web"),
    # Files read for the collectors: their FileRefused reasons are vllm_http's.
    *reasons_in_source(ROOT / "exporter", "bounded_files.py"),
    *reasons_in_source(ROOT / "exporter", "model_config.py"),
]


def test_the_source_scan_finds_the_reasons_it_is_meant_to() -> None:
    found = {(kind, reason) for kind, reason, _ in SOURCE}
    # One of each way a reason is passed, so a scan that finds nothing cannot pass.
    for expected in [
        ("collector", "body_too_large"),  # FetchError("...")
        ("collector", "dns"),  # returned by _network_reason
        ("collector", "too_many_samples"),  # reason="..."
        ("collector", "malformed_exposition"),  # a parameter's default
        ("collector", "unknown_topic"),  # Refused("...") in HandshakeReceiver
        ("collector", "rate_limited"),  # Refused("...") in Admission
        ("collector", "gpu_lost"),  # error_reason
        ("collector", "disconnected"),  # sink.fail(NAME, target, "...")
        ("collector", "malformed_batch"),  # sink.reject(NAME, target, "...")
        ("collector", "file_not_regular"),  # FileRefused("...")
        ("collector", "replay_timeout"),  # sink.reject(NAME, self.replay.endpoint, "...")
        ("collector", "pool_overflow"),  # self._hit("...")
        ("dropped", "unknown_block"),
        ("web", "head_too_large"),
        ("web", "auth_busy"),
        ("reload", "downgrade"),
    ]:
        assert expected in found


def test_every_reason_the_code_counts_is_declared() -> None:
    undeclared = sorted({(k, r, w) for k, r, w in SOURCE if r not in DECLARED[k]})
    assert not undeclared, "declare them in exporter/counted_reasons.py"


def test_every_collectors_reasons_are_declared_under_a_collector_kvcap_has() -> None:
    assert set(COLLECTOR_ERROR_REASONS) == set(COLLECTORS)


@pytest.mark.parametrize(
    "counter",
    [
        "kvcap_kv_events_dropped_total",
        "kvcap_web_requests_rejected_total",
        "kvcap_web_config_reload_errors_total",
    ],
)
def test_docs_metrics_lists_every_reason_of_a_counter(counter: str) -> None:
    page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    row = next(line for line in page.splitlines() if line.startswith(f"| `{counter}` |"))
    assert COUNTED_REASONS[counter] <= set(re.findall(r"`([a-z_]+)`", row))


@pytest.mark.parametrize(
    ("status", "reason"), [(404, "http_4xx"), (503, "http_5xx"), (999, "http_5xx")]
)
def test_a_status_past_599_is_counted_under_a_declared_reason(status: int, reason: str) -> None:
    """A real server on loopback answering a status http.client accepts (up to 999)."""
    with socket.create_server(("127.0.0.1", 0)) as server:

        def answer() -> None:
            connection, _ = server.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(
                    f"HTTP/1.1 {status} Odd\r\nContent-Length: 0\r\n\r\n".encode("ascii")
                )

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        port = server.getsockname()[1]
        with pytest.raises(FetchError) as failed:
            fetch(f"http://127.0.0.1:{port}/metrics", timeout_s=5, max_bytes=1024)
        thread.join(5)
    assert failed.value.reason == reason
    assert reason in COLLECTOR_ERROR_REASONS["vllm_http"]
