"""Live deployments: a real vLLM CPU server with kvcap's plugin, and kvcap sidecars beside it.

One server runs at a time (each takes both cores and ~1.5 GB per engine while starting).
A deployment is shared by the tests of one (release, model, data-parallel size), so pytest
starts each server once; the engine-death tests start their own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tools.live.models import write_model
from tools.live.server import VllmServer, plugin_site
from tools.live.sidecar import Sidecar, wait_for
from tools.live.vllm_install import vllm_python

POLL_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Deployment:
    """What a test of one live deployment sees."""

    release: str
    model: str
    data_parallel_size: int
    server: VllmServer
    http: Sidecar  # kvcap polling vLLM's HTTP endpoints only
    handshake: Sidecar  # kvcap fed by the plugin inside vLLM only


# (release, tiny model, data-parallel size): plain attention at DP=1, a sliding-window
# hybrid at DP=2, on every release that runs live here.
DEPLOYMENTS = [
    ("0.32.0", "llama", 1),
    ("0.32.0", "gemma3", 2),
    ("0.27.0", "llama", 1),
    ("0.27.0", "gemma3", 2),
]


def start_deployment(
    release: str,
    model: str,
    data_parallel_size: int,
    workdir: Path,
    *,
    http_args: Sequence[str] = (),
    handshake_args: Sequence[str] = (),
    vllm_env: dict[str, str] | None = None,
) -> tuple[VllmServer, Sidecar, Sidecar]:
    """vLLM with the plugin, a `vllm_http` sidecar and a `handshake` sidecar; all started."""
    python = vllm_python(release)
    model_dir = write_model(workdir, model)
    endpoint = f"ipc://{workdir}/handshake/kvcap.sock"
    server = VllmServer(
        python,
        model_dir,
        workdir,
        args=["--data-parallel-size", str(data_parallel_size)],
        env={
            "PYTHONPATH": str(plugin_site(python, workdir)),
            "KVCAP_HANDSHAKE_ENDPOINT": endpoint,
            **(vllm_env or {}),
        },
    )
    poll = f"--vllm.poll-interval={POLL_INTERVAL_S}"
    http = Sidecar(
        workdir,
        [
            "--no-collector.handshake",
            f"--vllm.url={server.url}",
            poll,
            f"--model.config={model_dir}",
            *http_args,
        ],
    )
    handshake = Sidecar(
        workdir, ["--no-collector.vllm_http", f"--handshake.listen={endpoint}", *handshake_args]
    )
    http.start()
    handshake.start()
    server.start()
    return server, http, handshake


def wait_for_engines(sidecar: Sidecar, server: VllmServer, count: int) -> None:
    """Until `count` engines show a capacity in the sidecar's /metrics."""

    def engines() -> bool:
        return len(sidecar.scrape().by_engine("kvcap_kv_cache_capacity_tokens")) == count

    def context() -> str:
        return sidecar.tail() + "\n--- vLLM ---\n" + server.tail()

    wait_for(engines, 30, f"{count} engines in kvcap's /metrics", context)


@pytest.fixture(scope="session", params=DEPLOYMENTS, ids=lambda d: f"{d[0]}-{d[1]}-dp{d[2]}")
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    release, model, dp = request.param
    workdir = tmp_path_factory.mktemp(f"live-{release}-{model}-dp{dp}")
    server, http, handshake = start_deployment(release, model, dp, workdir)
    _running.append((server, http, handshake))
    try:
        for sidecar in (http, handshake):
            wait_for_engines(sidecar, server, dp)
        yield Deployment(release, model, dp, server, http, handshake)
    finally:
        _stop_running()


# The shared deployment still running. pytest keeps a session fixture's last value until the
# session ends, so without this the last deployment (a DP=2 server) would run beside every
# live test after it: two vLLMs on 2 cores, and a sidecar reading the wrong one's /proc.
_running: list[tuple[VllmServer, Sidecar, Sidecar]] = []


def _stop_running() -> None:
    while _running:
        for process in _running.pop():
            process.stop()


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test of a shared deployment, stop it (its fixture's own teardown,
    which runs later, then finds nothing to stop)."""
    if nextitem is None or "deployment" not in getattr(nextitem, "fixturenames", ()):
        _stop_running()
