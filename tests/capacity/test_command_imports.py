"""`kvcap-exporter capacity` imports only what it uses: the exporter's daemon libraries
stay unloaded, so a plan answers at the speed of a shell command (timed in benchmarks/)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import GOLDEN

LLAMA = str(GOLDEN / "handshake" / "configs" / "llama-3.1-8b")

# The daemon's libraries and kvcap's modules built on them.
DAEMON_ONLY = (
    "prometheus_client",
    "zmq",
    "pynvml",
    "structlog",
    "yaml",
    "asyncio",
    "exporter.serve",
    "exporter.state",
    "exporter.exposition",
    "exporter.collectors.nvml_reader",
    "exporter.collectors.handshake",
    "exporter.collectors.kv_events",
    "exporter.collectors.vllm_http",
)

# Runs a statement, then prints whether it succeeded and the modules loaded.
PROBE = """
import json, sys
from exporter import cli
code = {statement}
print(json.dumps({{"code": code, "modules": sorted(sys.modules)}}))
"""


def modules_after(statement: str, *args: str) -> set[str]:
    run = subprocess.run(
        [sys.executable, "-c", PROBE.format(statement=statement), *args],
        capture_output=True,
        text=True,
        check=False,
    )
    document = json.loads(run.stdout.splitlines()[-1])
    assert document["code"] == 0, run.stderr
    return set(document["modules"])


def daemon_modules(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in DAEMON_ONLY or m.startswith(DAEMON_ONLY)}


@pytest.mark.parametrize(
    "args",
    [
        [LLAMA, "--kv-cache-memory-bytes", "20GiB"],
        ["--json", "--", "vllm", "serve", LLAMA, "-tp", "2", "--gpu-memory", "H100"],
        [LLAMA, "--kv-cache-memory-bytes", "20GiB", "--sweep", "tp=1,2", "--port", "8000"],
    ],
)
def test_capacity_loads_none_of_the_daemons_libraries(args: list[str]) -> None:
    modules = modules_after("cli.main(sys.argv[1:])", "capacity", *args)
    assert "exporter.capacity_cli" in modules  # the probe ran the command it names
    assert daemon_modules(modules) == set()


def test_the_probe_sees_the_daemons_libraries_where_they_load() -> None:
    """The same probe finds them once the serve command's module loads: the check above
    can fail."""
    modules = modules_after("cli.build_parser('serve') and 0")
    assert {"prometheus_client", "zmq", "structlog", "exporter.serve"} <= daemon_modules(modules)
