"""kvcap's plugin loaded by a live vLLM from the volume layout the Helm chart mounts: the
sidecar image's /opt/kvcap-plugin (built with the Dockerfile's own steps), copied by the
chart's init-container command into an emptyDir, mounted read-only and put on vLLM's
PYTHONPATH exactly as the chart renders the vLLM container. Nothing else on vLLM's path
has the plugin: vLLM's environment and the working directory lack it."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import CHART, TOOLS_BIN
from tests.deploy.test_container import (
    DOCKERFILE,
    Image,
    build_env,
    parse_dockerfile,
    run_stage,
)
from tests.live.conftest import wait_for_engines
from tests.tools import require_file
from tools.live.models import write_model
from tools.live.server import VllmServer
from tools.live.sidecar import Sidecar
from tools.live.vllm_install import vllm_python

RELEASE = "0.32.0"
# What the image's paths are under the test's folders.
IMAGE_PLUGIN = "/opt/kvcap-plugin"
INSTALLER_MOUNT = "/kvcap-plugin"


def chart_pod() -> dict[str, object]:
    """The example pod as `helm template` renders it with the chart's defaults."""
    helm = require_file(TOOLS_BIN / "helm", "`make tools` unpacks it")
    rendered = subprocess.run(
        [helm, "template", "kvcap", CHART, "--set", "example.enabled=true"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    (deployment,) = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    spec: dict[str, object] = deployment["spec"]["template"]["spec"]
    return spec


@pytest.fixture(scope="module")
def image_root() -> Iterator[Path]:
    """The sidecar image's final stage, installed under a folder (tests/deploy's way)."""
    root = Path(tempfile.mkdtemp(prefix="kvcap-image-"))
    root.chmod(0o755)
    stages = parse_dockerfile(DOCKERFILE).stages
    image = Image(root=root, stages=stages, env={})
    for stage in stages:
        run_stage(image, stage, build_env())
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


def test_vllm_loads_the_plugin_from_the_charts_volume(
    image_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = chart_pod()
    installer = next(c for c in spec["initContainers"] if c["name"] == "kvcap-plugin")  # type: ignore[attr-defined]
    vllm = next(c for c in spec["containers"] if c["name"] == "vllm")  # type: ignore[attr-defined]
    mount = next(m for m in vllm["volumeMounts"] if m["name"] == "kvcap-plugin")
    assert mount["readOnly"] is True
    pythonpath = next(e["value"] for e in vllm["env"] if e["name"] == "PYTHONPATH")
    assert pythonpath == mount["mountPath"]

    # The emptyDir; the init container's command with its paths mapped onto the test's.
    volume = tmp_path / "volume"
    volume.mkdir()

    def mapped(arg: str) -> str:
        for container_path, here in (
            (IMAGE_PLUGIN, image_root / IMAGE_PLUGIN.lstrip("/")),
            (INSTALLER_MOUNT, volume),
        ):
            if arg == container_path or arg.startswith(container_path + "/"):
                return str(here) + arg.removeprefix(container_path)
        return arg

    command = [mapped(arg) for arg in installer["command"]]
    copied = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert copied.returncode == 0, f"{shlex.join(command)}: {copied.stderr}"
    # readOnly: true, as the kubelet mounts it for vLLM.
    for path in [volume, *volume.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))

    # Run from a folder of its own: the repository's root holds kvcap's source and
    # egg-info, which `python -m` would put on sys.path first.
    workdir = tmp_path / "run"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    python = vllm_python(RELEASE)
    probe = "from importlib.metadata import entry_points as e; print([p.value for p in e(group='vllm.general_plugins') if p.name == 'kvcap'])"  # noqa: E501
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    without = subprocess.run(
        [python, "-c", probe], capture_output=True, text=True, cwd=workdir, env=clean, check=True
    )
    assert without.stdout.strip() == "[]", "vLLM's environment has the plugin by itself"
    with_volume = subprocess.run(
        [python, "-c", probe],
        capture_output=True,
        text=True,
        cwd=workdir,
        env={**clean, "PYTHONPATH": str(volume)},
        check=True,
    )
    assert with_volume.stdout.strip() == "['exporter.vllm_plugin:register']"

    model_dir = write_model(workdir, "llama")
    endpoint = f"ipc://{workdir}/handshake/kvcap.sock"
    server = VllmServer(
        python,
        model_dir,
        workdir,
        env={
            "PYTHONPATH": str(volume),
            "KVCAP_HANDSHAKE_ENDPOINT": endpoint,
            # vLLM lists the general plugins it loads, per process, at debug level.
            "VLLM_LOGGING_LEVEL": "DEBUG",
        },
    )
    sidecar = Sidecar(workdir, ["--no-collector.vllm_http", f"--handshake.listen={endpoint}"])
    sidecar.start()
    try:
        server.start()
        # The engine core's hooks ran: its ready response reached the sidecar.
        wait_for_engines(sidecar, server, 1)
        (info,) = sidecar.scrape().labels("kvcap_engine_info")
        assert (info["engine"], info["collectors"]) == ("0", "handshake"), info
        log = server.log()
    finally:
        server.stop()
        sidecar.stop()
    loaded_in = {
        line.split(" pid=")[0].lstrip("(")
        for line in log.splitlines()
        if "kvcap -> exporter.vllm_plugin:register" in line
    }
    # The engine core and its worker found it on the path (vLLM 0.32's API server loads
    # general plugins too, while parsing its arguments, but logs no list there; the probe
    # above is its discovery, with the same PYTHONPATH in the same Python).
    assert any(p.startswith("EngineCore") for p in loaded_in), loaded_in
    assert any(p.startswith("VllmWorker") for p in loaded_in), loaded_in
    assert not (volume / "exporter" / "__pycache__").exists()  # read-only, as mounted
