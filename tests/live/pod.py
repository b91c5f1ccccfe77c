"""A rendered pod run as processes, the kubelet's way: its volumes as folders, one network
and (where the pod shares it) one PID namespace, each container in a mount namespace of its
own (tests/live/pod_container.py), the init containers in order (a native sidecar once its
startup probe passes), then the containers; probes executed from their rendered specs.

Needs root (namespaces, bind mounts, another user) and POD_TOOLS; the test fails without them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tools.live.process import LoggedProcess

# What running a pod takes besides root (util-linux, iproute2).
POD_TOOLS = ("unshare", "nsenter", "setpriv", "mount", "ip")

T = TypeVar("T")
CONTAINER_SETUP = Path(__file__).with_name("pod_container.py")
CLONE_NEWNET = 0x40000000
START_TIMEOUT_S = 30.0
Manifest = dict[str, Any]


@dataclass(frozen=True)
class ContainerImage:
    """What stands in for a container's image: its entrypoint and environment, its own
    folders (container path -> host folder), and host paths its programs need."""

    entrypoint: tuple[str, ...]
    env: dict[str, str]
    folders: dict[str, Path] = field(default_factory=dict)
    needed: tuple[str, ...] = ()


class PodNetwork:
    """The pod's network namespace, entered by one worker thread for the test's requests
    (a namespace is per thread: the test's other threads stay on the host's network)."""

    def __init__(self, holder_pid: int) -> None:
        self._fd = os.open(f"/proc/{holder_pid}/ns/net", os.O_RDONLY)
        self._executor = ThreadPoolExecutor(1, initializer=self._enter)

    def _enter(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(self._fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the pod's network")

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on the pod's network (processes it starts are on it too)."""
        return self._executor.submit(function, *args).result()

    def get(self, url: str, timeout_s: float = 5) -> tuple[int, bytes] | None:
        return self.call(_get, url, timeout_s)

    def close(self) -> None:
        self._executor.shutdown()
        os.close(self._fd)


def _get(url: str, timeout_s: float) -> tuple[int, bytes] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return None


class Container(LoggedProcess):
    """One container's process tree, its output in a log file."""

    def __init__(self, spec: Manifest, log_path: Path, argv: list[str]) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.log_path = log_path
        self.argv = argv
        self.started_at = 0.0

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.spawn(self.argv, {"PATH": os.environ["PATH"]}, start_new_session=True)

    def stop(self) -> None:
        if self.process is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=20)

    def port(self, name_or_number: str | int) -> int:
        """A probe's or monitor's port: a number, or a name among the container's ports."""
        if isinstance(name_or_number, int):
            return name_or_number
        for port in self.spec.get("ports", []):
            if port.get("name") == name_or_number:
                return int(port["containerPort"])
        raise AssertionError(f"{self.name}: no port named {name_or_number!r}")


class Pod:
    """A rendered pod spec, run under `workdir`."""

    def __init__(
        self,
        spec: Manifest,
        workdir: Path,
        images: dict[str, ContainerImage],
        config_maps: dict[str, dict[str, str]],
        volume_contents: dict[str, Path],
    ) -> None:
        self.spec = spec
        self.workdir = workdir
        self.images = images
        self.config_maps = config_maps
        self.volume_contents = volume_contents
        self.volumes: dict[str, Path] = {}
        self.containers: dict[str, Container] = {}
        self.probes: list[tuple[str, str, bool]] = []  # (container, kind, passed)
        self._holder: subprocess.Popen[bytes] | None = None
        self.holder_pid = 0
        self.net: PodNetwork | None = None

    # --- the pod's namespaces and volumes ---------------------------------------------------

    def _start_holder(self) -> None:
        """The pod's network and PID namespaces, held by a sleeping process (the pause
        container); loopback up. Killing it ends every process of the shared PID namespace."""
        self._holder = subprocess.Popen(
            ["unshare", "--net", "--pid", "--fork", "--kill-child", "--",
             "sh", "-c", "ip link set lo up && exec sleep 86400"],
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self._holder.pid}/task/{self._holder.pid}/children")
            pids = children.read_text().split() if children.exists() else []
            if pids and Path(f"/proc/{pids[0]}/comm").read_text().strip() == "sleep":
                self.holder_pid = int(pids[0])
                self.net = PodNetwork(self.holder_pid)
                return
            time.sleep(0.05)
        raise AssertionError("the pod's namespaces did not come up")

    def _make_volumes(self) -> None:
        for volume in self.spec.get("volumes", []):
            name = volume["name"]
            assert "emptyDir" in volume, f"volume {name}: only emptyDir is run here"
            folder = self.workdir / "volumes" / name
            folder.parent.mkdir(parents=True, exist_ok=True)
            if name in self.volume_contents:
                shutil.copytree(self.volume_contents[name], folder, symlinks=True)
            else:
                folder.mkdir()
            folder.chmod(0o777)  # an emptyDir is world-writable
            self.volumes[name] = folder

    # --- containers ---------------------------------------------------------------------------

    def env_of(self, spec: Manifest) -> dict[str, str]:
        """The image's environment, then the container's (configMapKeyRef resolved)."""
        env = dict(self.images[spec["name"]].env)
        for variable in spec.get("env", []):
            if "value" in variable:
                env[variable["name"]] = variable["value"]
                continue
            ref = variable["valueFrom"]["configMapKeyRef"]
            data = self.config_maps.get(ref["name"], {})
            if ref["key"] in data:
                env[variable["name"]] = data[ref["key"]]
            else:
                assert ref.get("optional"), f"{spec['name']}: no ConfigMap key {ref}"
        return env

    def _container(self, spec: Manifest) -> Container:
        image = self.images[spec["name"]]
        security = spec.get("securityContext", {})
        mounts = [
            {"path": path, "source": str(source), "read_only": True}
            for path, source in image.folders.items()
        ] + [
            {
                "path": m["mountPath"],
                "source": str(self.volumes[m["name"]]),
                "read_only": bool(m.get("readOnly", False)),
            }
            for m in spec.get("volumeMounts", [])
        ]
        command = list(spec.get("command") or image.entrypoint) + list(spec.get("args", []))
        root = self.workdir / "roots" / spec["name"]
        root.mkdir(parents=True)
        setup = {
            "root": str(root),
            "mounts": mounts,
            "needed": list(image.needed),
            "read_only_root": bool(security.get("readOnlyRootFilesystem", False)),
            "uid": security.get("runAsUser"),
            "gid": security.get("runAsGroup", security.get("runAsUser")),
            "no_new_privs": security.get("allowPrivilegeEscalation") is False,
            "drop_all_capabilities": "ALL" in security.get("capabilities", {}).get("drop", []),
            "working_dir": spec.get("workingDir", "/"),
            "command": command,
            "env": self.env_of(spec),
        }
        namespaces = [f"--net=/proc/{self.holder_pid}/ns/net"]
        pid_namespace = ["--pid", "--fork", "--kill-child"]
        if self.spec.get("shareProcessNamespace"):
            namespaces.append(f"--pid=/proc/{self.holder_pid}/ns/pid")
            pid_namespace = []
        argv = [
            "nsenter", *namespaces, "--",
            "unshare", "--mount", "--propagation", "private", *pid_namespace, "--",
            sys.executable, str(CONTAINER_SETUP), json.dumps(setup),
        ]  # fmt: skip
        return Container(spec, self.workdir / f"{spec['name']}.log", argv)

    def probe(self, container: Container, kind: str) -> bool:
        """One execution of a container's `kind` probe (an httpGet), as the kubelet does it."""
        spec = container.spec[kind]["httpGet"]
        scheme = spec.get("scheme", "HTTP").lower()
        url = f"{scheme}://127.0.0.1:{container.port(spec['port'])}{spec['path']}"
        assert self.net is not None
        answer = self.net.get(url, float(container.spec[kind].get("timeoutSeconds", 1)))
        passed = answer is not None and 200 <= answer[0] < 400
        self.probes.append((container.name, kind, passed))
        return passed

    def wait_started(self, container: Container, speed_up: float = 1.0) -> None:
        """Until the startup probe passes, at its period, up to its failure threshold
        (`speed_up` divides the period: the test's CPU vLLM starts in minutes, not 30)."""
        if "startupProbe" not in container.spec:
            return
        spec = container.spec["startupProbe"]
        period_s = float(spec.get("periodSeconds", 10)) / speed_up
        for _ in range(int(spec.get("failureThreshold", 3))):
            if container.process is not None and container.process.poll() is not None:
                raise AssertionError(f"{container.name} exited\n{container.tail()}")
            if self.probe(container, "startupProbe"):
                return
            time.sleep(period_s)
        raise AssertionError(f"{container.name}: startup probe never passed\n{container.tail()}")

    def start(self, speed_up: float = 1.0) -> None:
        """Init containers in order (a native sidecar, restartPolicy Always, is left running
        once started), then the containers, each waited for by its startup probe."""
        self._start_holder()
        self._make_volumes()
        for spec in self.spec.get("initContainers", []):
            container = self._container(spec)
            self.containers[container.name] = container
            container.start()
            if spec.get("restartPolicy") == "Always":
                self.wait_started(container)
                continue
            assert container.process is not None
            code = container.process.wait(timeout=120)
            assert code == 0, f"init container {container.name} exited {code}\n{container.tail()}"
        started = [self._container(spec) for spec in self.spec["containers"]]
        for container in started:
            self.containers[container.name] = container
            container.start()
        for container in started:
            self.wait_started(container, speed_up)

    def stop(self) -> None:
        for container in reversed(list(self.containers.values())):
            container.stop()
        if self._holder is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._holder.pid, signal.SIGKILL)
            self._holder.wait(timeout=30)
        if self.net is not None:
            self.net.close()
