"""The suite's lanes, the property-test budgets, and where the fixtures are."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, is_hypothesis_test, settings

from exporter.collectors import vllm_http

# Property tests run a short budget by default; `make fuzz` selects the long one.
settings.register_profile("default", max_examples=100, deadline=None)
settings.register_profile(
    "fuzz", max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck)
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
settings.load_profile(PROFILE)


def fuzz_budget(short: int, long: int) -> int:
    """How many inputs a hand-written fuzz loop tries: `long` under `make fuzz`."""
    return long if PROFILE == "fuzz" else short


TESTS = Path(__file__).parent
# The kinds of test, each a lane (`pytest -m KIND`); README "Development" says which make
# target runs which.
KINDS = ("unit", "process", "deploy", "live")
# The kind of each test, by where it lives: the longest matching folder or file wins, and a
# test marked with a kind itself keeps it (the few process tests of an in-process file).
# unit: in-process (threads and loopback sockets included); process: starts processes of
# ours (the CLI, the daemon, forked engines); deploy: helm, kubectl, promtool, a real
# Prometheus; live: a real vLLM (`make live-deps` installs it).
LANES = {
    "": "unit",
    "deploy": "deploy",
    "integration": "deploy",
    "live": "live",
    "bench": "process",
    "capacity/test_bad_input_files.py": "process",
    "capacity/test_command_imports.py": "process",
    "capacity/test_explain_log_bad_input.py": "process",
    "test_cli.py": "process",
    "test_serve.py": "process",
    "faults/test_engine_killed.py": "process",
    "faults/test_hostile_config_files.py": "process",
    "faults/test_hostile_handshake.py": "process",
    "faults/test_hostile_handshake_bounds.py": "process",
    "faults/test_hostile_http.py": "process",
    "faults/test_hostile_kv_events.py": "process",
    "faults/test_hostile_vllm.py": "process",
    "nvml/test_nvml_check.py": "process",
}


def lane(path: Path) -> str:
    """The kind of the tests in `path` (a file under tests/), from LANES."""
    parts = path.relative_to(TESTS).parts
    for length in range(len(parts), 0, -1):
        found = LANES.get("/".join(parts[:length]))
        if found is not None:
            return found
    return LANES[""]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """`-m unit` (`make check`) does not import the modules of the other lanes: a folder or
    file whose lane is another kind holds no unit test (test_lanes checks that none is
    marked one), and deploy's imports alone (jsonschema, pydantic) are a second a worker."""
    if config.option.markexpr != "unit" or not collection_path.is_relative_to(TESTS):
        return None
    if lane(collection_path) == "unit":
        return None
    inside = collection_path.relative_to(TESTS).as_posix() + "/"
    if any(where.startswith(inside) and kind == "unit" for where, kind in LANES.items()):
        return None  # a folder of another kind with a unit file in it
    return True


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets its kind; property tests and fuzz loops also get `fuzz`."""
    for item in items:
        if not any(item.get_closest_marker(kind) for kind in KINDS):
            item.add_marker(lane(item.path))
        function = getattr(item, "function", None)
        if function is not None and is_hypothesis_test(function):
            item.add_marker("fuzz")


@pytest.fixture(scope="session")
def empty_proc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A /proc with no process in it."""
    return tmp_path_factory.mktemp("proc")


@pytest.fixture(autouse=True)
def _in_process_tests_see_no_vllm_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vllm_http, told no `vllm serve` arguments, finds them in /proc: an in-process test
    that does not give its own folder looks at an empty one. The machine's processes are
    not a test's input (another suite's stand-in there, with a FIFO for its config file,
    held one such test for minutes)."""
    if request.node.get_closest_marker("unit") is None:
        return
    empty = request.getfixturevalue("empty_proc")
    for name in ("discover_serve_args", "discover_hf_environ"):
        monkeypatch.setattr(vllm_http, name, _defaulting_to(empty, getattr(vllm_http, name)))


def _defaulting_to(empty: Path, discover: Callable[..., Any]) -> Any:
    """`discover` with `empty` as its /proc unless the caller names one (a test's own)."""

    def looking(proc: Path = empty, *args: Any, **kwargs: Any) -> Any:
        return discover(proc, *args, **kwargs)

    return looking


FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "golden"
GOLDEN_CASES = GOLDEN / "vllm-0.33-capacity.jsonl"


def load_golden_cases() -> list[dict[str, Any]]:
    with GOLDEN_CASES.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
