"""The images, without a container runtime: the Dockerfiles' install steps run as written
(container paths mapped into a temporary folder), and the daemon installed that way runs as
the pod runs it: as the image's non-root user, with no capabilities, a read-only root
filesystem (a private mount namespace, where the tests may make one) and HOME, TMPDIR and
the working directory read-only, writing nothing but its socket in the socket folder."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
import yaml
import zmq

from exporter import __version__
from tests.deploy.conftest import CHART, DEPLOY, ROOT, run
from tests.support import free_port
from tests.tools import require_tool

DOCKERFILE = ROOT / "Dockerfile"
PLUGIN_DOCKERFILE = DEPLOY / "vllm-plugin" / "Dockerfile"
# The folders the Dockerfiles name, and where they are put for the tests.
CONTAINER_DIRS = ("/opt/kvcap-plugin", "/opt/kvcap", "/run/kvcap", "/dist", "/src")
CONTAINER_PATH = re.compile(
    r"(?<![\w.])(" + "|".join(re.escape(d) for d in CONTAINER_DIRS) + r")(?=/|$|[\s\"':])"
)
INSTALL_STEP = re.compile(r"\bpip\b")
STARTUP_TIMEOUT_S = 30.0


# --- reading a Dockerfile -----------------------------------------------------------------


@dataclass
class Instruction:
    keyword: str
    flags: list[str]
    arguments: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    args: dict[str, str]  # the ARGs before the first FROM, with their defaults
    stages: list[Stage]


def parse_dockerfile(path: Path) -> Dockerfile:
    """Stages and their instructions: continuations joined, comments dropped, leading
    --flags (RUN --mount=..., COPY --from=...) split off."""
    logical: list[str] = []
    pending = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("#") or (not line.strip() and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    stages: list[Stage] = []
    args: dict[str, str] = {}
    for text in logical:
        keyword, _, rest = text.strip().partition(" ")
        flags = []
        while rest.lstrip().startswith("--"):
            flag, _, rest = rest.lstrip().partition(" ")
            flags.append(flag)
        instruction = Instruction(keyword.upper(), flags, rest.strip())
        if instruction.keyword == "FROM":
            base, _, name = instruction.arguments.partition(" AS ")
            stages.append(Stage(base.strip(), name.strip() or None))
        elif stages:
            stages[-1].instructions.append(instruction)
        elif instruction.keyword == "ARG":
            args.update(key_values(instruction.arguments))
    return Dockerfile(args, stages)


def expand(value: str, env: dict[str, str]) -> str:
    """Docker's $VAR and ${VAR} in ENV values."""
    return re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: env.get(m.group(1) or m.group(2), ""), value)


def key_values(arguments: str) -> list[tuple[str, str]]:
    pairs = [word.partition("=") for word in shlex.split(arguments)]
    return [(key, value) for key, _, value in pairs]


@cache
def dockerignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, pattern) for each line of .dockerignore."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            glob = line.strip().removeprefix("!").strip("/")
            regex = re.escape(glob).replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
            patterns.append((line.startswith("!"), re.compile(regex)))
    return patterns


def dockerignored(relative: str) -> bool:
    """Whether .dockerignore keeps a path out of the build context (last match wins; a
    pattern that matches a parent folder matches its contents)."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for negated, pattern in dockerignore_patterns():
        if any(pattern.fullmatch(c) for c in candidates):
            ignored = not negated
    return ignored


# --- running the install steps ------------------------------------------------------------


@dataclass
class Image:
    """A Dockerfile's final stage, installed under `root` instead of `/`."""

    root: Path
    stages: list[Stage]
    env: dict[str, str]

    def host(self, text: str) -> str:
        """`text` with the image's folders mapped under root."""
        return CONTAINER_PATH.sub(lambda m: str(self.root) + m.group(1), text)

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def run_stage(image: Image, stage: Stage, base_env: dict[str, str]) -> dict[str, str]:
    """COPY (from the context) and the install steps of one stage; returns its ENV."""
    env = dict(base_env)
    for instruction in stage.instructions:
        if instruction.keyword == "ENV":
            for key, value in key_values(instruction.arguments):
                env[key] = expand(image.host(value), env)
        elif instruction.keyword == "COPY" and not instruction.flags:
            *sources, destination = shlex.split(instruction.arguments)
            for source in sources:
                copy_from_context(source, image.host(destination))
        elif instruction.keyword == "RUN" and INSTALL_STEP.search(instruction.arguments):
            result = run(["sh", "-c", image.host(instruction.arguments)], env=env, cwd=image.root)
            assert result.returncode == 0, f"{instruction.arguments}\n{result.stderr[-4000:]}"
    return env


def copy_from_context(source: str, destination: str) -> None:
    """COPY: a file into a folder (destination ending in /) or to a path; a folder's
    contents into the destination; what .dockerignore leaves out is not there."""
    path = ROOT / source
    assert not dockerignored(source), f"{source} is not in the build context (.dockerignore)"
    if path.is_file():
        target = Path(destination) / path.name if destination.endswith("/") else Path(destination)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        return
    for file in sorted(path.rglob("*")):
        if file.is_file() and not dockerignored(file.relative_to(ROOT).as_posix()):
            target = Path(destination) / file.relative_to(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, target)


def build_env() -> dict[str, str]:
    """The environment RUN steps see: the test's Python 3.11 (with pip) as `python`."""
    python_bin = Path(sys.executable).parent
    return {**os.environ, "PATH": f"{python_bin}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.fixture(scope="session")
def image() -> Iterator[Image]:
    # Not under pytest's 0700 temporary folders: the image's user must reach the venv.
    root = Path(tempfile.mkdtemp(prefix="kvcap-image-"))
    root.chmod(0o755)
    stages = parse_dockerfile(DOCKERFILE).stages
    built = Image(root=root, stages=stages, env={})
    for stage in stages[:-1]:
        run_stage(built, stage, build_env())
    built.env = run_stage(built, stages[-1], build_env())
    yield built
    shutil.rmtree(root, ignore_errors=True)


def venv_of(image: Image) -> Path:
    return Path(image.env["VIRTUAL_ENV"])


# --- the image as built --------------------------------------------------------------------


def test_dockerfile_shape() -> None:
    dockerfile = parse_dockerfile(DOCKERFILE)
    builder, final = dockerfile.stages
    assert builder.name == "builder"
    assert [i.arguments for i in builder.all("RUN")] == [
        "python -m pip wheel --no-deps --wheel-dir /dist /src"
    ]
    assert final.base == builder.base == "${PYTHON_IMAGE}"
    # The tests install with this Python: the image's must be the same minor version.
    assert dockerfile.args["PYTHON_IMAGE"] == "python:3.11-slim"
    assert sys.version_info[:2] == (3, 11)
    # Only the wheel comes from the builder, through a bind mount: no layer keeps it.
    (install,) = [i for i in final.all("RUN") if INSTALL_STEP.search(i.arguments)]
    assert install.flags == ["--mount=type=bind,from=builder,source=/dist,target=/dist"]
    assert not final.all("COPY")
    env = dict(kv for i in final.all("ENV") for kv in key_values(i.arguments))
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["KVCAP_HANDSHAKE_LISTEN"] == "ipc:///run/kvcap/handshake.sock"
    assert env["HOME"] == env["TMPDIR"] == "/run/kvcap"
    (user,) = final.all("USER")
    assert user.arguments == "65532:65532"
    # The socket folder exists in the image too, for the image's user only.
    assert "install -d -o 65532 -g 65532 -m 0700 /run/kvcap" in [
        i.arguments for i in final.all("RUN")
    ]
    assert [i.arguments for i in final.all("EXPOSE")] == ["9470"]
    assert [i.arguments for i in final.all("ENTRYPOINT")] == ['["kvcap-exporter", "serve"]']
    labels = {k for i in final.all("LABEL") for k, _ in key_values(i.arguments)}
    assert {
        "org.opencontainers.image.title",
        "org.opencontainers.image.description",
        "org.opencontainers.image.version",
        "org.opencontainers.image.revision",
        "org.opencontainers.image.created",
        "org.opencontainers.image.licenses",
    } <= labels


@pytest.mark.parametrize(
    ("path", "in_context"),
    [
        ("pyproject.toml", True),
        ("README.md", True),
        ("exporter/cli.py", True),
        ("exporter/capacity/__init__.py", True),
        ("exporter/__pycache__/cli.cpython-311.pyc", False),
        (".venv/bin/python", False),
        (".git/HEAD", False),
        ("tests/conftest.py", False),
        ("helm/kvcap-exporter/values.yaml", False),
    ],
)
def test_build_context(path: str, in_context: bool) -> None:
    assert dockerignored(path) is not in_context


def test_image_user_matches_the_deployments() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert values["sidecar"]["securityContext"]["runAsUser"] == 65532
    assert values["sidecar"]["securityContext"]["runAsGroup"] == 65532
    patch = (DEPLOY / "components" / "kvcap-sidecar" / "sidecar-patch.yaml").read_text()
    assert "runAsUser: 65532" in patch
    assert "runAsGroup: 65532" in patch


def test_install_steps_give_a_venv_with_only_the_package(image: Image) -> None:
    venv = venv_of(image)
    assert venv == image.root / "opt" / "kvcap"
    wheels = list((image.root / "dist").glob("kvcap_exporter-*.whl"))
    assert [w.name for w in wheels] == [f"kvcap_exporter-{__version__}-py3-none-any.whl"]
    version = run([venv / "bin" / "kvcap-exporter", "--version"], env={"PATH": "/usr/bin:/bin"})
    assert version.returncode == 0, version.stderr
    assert __version__ in version.stdout
    listing = run(
        [
            venv / "bin" / "python",
            "-c",
            "import importlib.metadata as m; print('\\n'.join(sorted("
            "d.metadata['Name'].lower() for d in m.distributions())))",
        ]
    )
    installed = set(listing.stdout.split())
    assert "kvcap-exporter" in installed
    # No pip, no build tools, nothing of the test environment.
    assert not installed & {"pip", "setuptools", "wheel", "pytest", "mypy", "ruff"}
    assert not (venv / "bin" / "pip").exists()
    # Bytecode was compiled at install time: nothing to write on a read-only root.
    package = next(venv.glob("lib/python3*/site-packages/exporter"))
    assert list((package / "__pycache__").glob("cli.*.pyc"))


def test_plugin_image_steps_install_only_the_plugin(image: Image) -> None:
    """deploy/vllm-plugin/Dockerfile: the same builder; the wheel goes into vLLM's Python
    (here a fresh venv standing in for it) without dependencies, and its entry point is
    found, as the Dockerfile's own check asserts."""
    stages = parse_dockerfile(PLUGIN_DOCKERFILE).stages
    main_builder = parse_dockerfile(DOCKERFILE).stages[0]
    assert stages[0].instructions == main_builder.instructions
    assert stages[-1].base == "${VLLM_IMAGE}"
    vllm_python = image.root / "vllm-python"
    created = run([sys.executable, "-m", "venv", vllm_python])
    assert created.returncode == 0, created.stderr
    env = build_env()
    env["PATH"] = f"{vllm_python / 'bin'}{os.pathsep}{env['PATH']}"
    plugin_image = Image(root=image.root, stages=stages, env={})
    run_stage(plugin_image, stages[-1], env)
    listing = run([vllm_python / "bin" / "python", "-m", "pip", "list", "--format=freeze"])
    installed = {line.split("==")[0].lower() for line in listing.stdout.split()}
    assert "kvcap-exporter" in installed
    assert not installed & {"msgspec", "pyzmq", "prometheus-client", "structlog", "bcrypt"}


# What the plugin module may import in vLLM's Python: the standard library, itself and the
# two packages vLLM always has.
PLUGIN_IMPORT_CHECK = """
import importlib.abc, json, sys
plugin = sys.argv[1]
allowed = set(sys.stdlib_module_names) | {"exporter", "msgspec", "zmq"}

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.partition(".")[0] not in allowed:
            raise ImportError(f"the plugin imports {name}")
        return None

sys.meta_path.insert(0, Refuse())
sys.path.insert(0, plugin)  # as PYTHONPATH puts it: before site-packages
from importlib.metadata import entry_points
found = [e for e in entry_points(group="vllm.general_plugins") if e.name == "kvcap"]
register = found[0].load()
register()
print(json.dumps({"entry_points": [e.value for e in found],
                  "module": sys.modules[register.__module__].__file__,
                  "dist": str(found[0].dist.locate_file(""))}))
"""


def test_image_carries_the_plugin_folder_for_vllm(image: Image) -> None:
    """/opt/kvcap-plugin: the package and its .dist-info (the entry point), nothing else;
    found from the folder alone and importing only what vLLM has."""
    plugin = image.root / "opt" / "kvcap-plugin"
    assert sorted(p.name for p in plugin.iterdir()) == [
        "exporter",
        f"kvcap_exporter-{__version__}.dist-info",
    ]
    dist_info = plugin / f"kvcap_exporter-{__version__}.dist-info"
    entry_points = (dist_info / "entry_points.txt").read_text(encoding="utf-8")
    assert "[vllm.general_plugins]\nkvcap = exporter.vllm_plugin:register" in entry_points
    assert not list(plugin.rglob("__pycache__"))  # vLLM's Python may be another version
    env = {k: v for k, v in os.environ.items() if k != "KVCAP_HANDSHAKE_ENDPOINT"}
    result = run([sys.executable, "-c", PLUGIN_IMPORT_CHECK, plugin], env=env)
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert loaded["entry_points"] == ["exporter.vllm_plugin:register"]
    assert loaded["module"] == str(plugin / "exporter" / "vllm_plugin.py")
    assert loaded["dist"] == str(plugin)


def test_the_copy_in_the_chart_matches_the_image() -> None:
    """The chart's init container copies the folder the Dockerfile fills."""
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    assert "--target /opt/kvcap-plugin " in dockerfile
    sidecar = (CHART / "templates" / "_sidecar.tpl").read_text(encoding="utf-8")
    assert 'command: ["cp", "-R", "/opt/kvcap-plugin/.", "/kvcap-plugin/"]' in sidecar


# --- the daemon, run the way the pod runs it ------------------------------------------------


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def snapshot(root: Path, skip: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under root with its mode, size and mtime; `skip` (the socket folder) left
    out, since the daemon may write there."""
    entries = {}
    for directory, subdirs, files in os.walk(root):
        for name in [*subdirs, *files]:
            path = Path(directory) / name
            if path == skip or skip in path.parents:
                continue
            info = path.lstat()
            entries[str(path.relative_to(root))] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return entries


# A private mount namespace with the container's view: the socket folder an in-memory
# emptyDir, every other mount read-only (as readOnlyRootFilesystem makes the root), then the
# command. Mounts that refuse are checked by the write probes.
READ_ONLY_ROOT = r"""
set -u
socket_dir=$1; image_root=$2; shift 2
mount -t tmpfs -o mode=0777,size=1m kvcap-run "$socket_dir" || exit 96
awk '{print $2}' /proc/self/mounts | sort -u | while read -r target; do
  case "$target" in
    /proc|/proc/*|/sys|/sys/*|/dev|/dev/*|"$socket_dir") ;;
    *) mount -o remount,bind,ro "$target" 2>/dev/null ;;
  esac
done
for probe in / "$image_root"; do
  if touch "$probe/.kvcap-write-probe" 2>/dev/null; then
    echo "still writable: $probe" >&2; exit 97
  fi
done
exec "$@"
"""


def can_make_read_only_root() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = run(["unshare", "--mount", "--propagation", "private", "true"])
    return probe.returncode == 0


@dataclass
class Daemon:
    process: subprocess.Popen[str]
    url: str
    socket_path: Path  # as the test sees it
    uid: int
    image_root: Path
    socket_dir: Path
    before: dict[str, tuple[int, int, int]]

    def written_outside_the_socket_folder(self) -> set[str]:
        after = snapshot(self.image_root, skip=self.socket_dir)
        changed = {
            k for k in self.before.keys() | after.keys() if self.before.get(k) != after.get(k)
        }
        # Without a mount namespace the socket folder is the real one: only the socket.
        extra = {p.name for p in self.socket_dir.iterdir()} - {"handshake.sock"}
        return changed | {f"{self.socket_dir}/{name}" for name in extra}


@pytest.fixture
def daemon(image: Image) -> Iterator[Daemon]:
    final = image.final
    (user,) = final.all("USER")
    uid, gid = (int(part) for part in user.arguments.split(":"))
    socket_dir = image.root / "run" / "kvcap"
    socket_dir.mkdir(parents=True, exist_ok=True)
    read_only = image.root / "read-only"
    read_only.mkdir(exist_ok=True)
    venv = venv_of(image)
    assert image.env["KVCAP_HANDSHAKE_LISTEN"] == f"ipc://{socket_dir}/handshake.sock"

    port = free_port()
    (entrypoint,) = final.all("ENTRYPOINT")
    command = [
        *json.loads(entrypoint.arguments),
        f"--web.listen-address=127.0.0.1:{port}",
        f"--vllm.url=http://127.0.0.1:{free_port()}",  # nothing listens: a refused poll
    ]
    # The image's environment, with HOME and TMPDIR read-only too.
    env = {
        key: value
        for key, value in image.env.items()
        if key in {"VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED"}
        or key.startswith("KVCAP_")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}/usr/local/bin:/usr/bin:/bin"
    env |= {"HOME": str(read_only), "TMPDIR": str(read_only)}
    assert shutil.which(command[0], path=env["PATH"]) == str(venv / "bin" / "kvcap-exporter")

    if os.geteuid() == 0:
        # runAsUser/runAsGroup, allowPrivilegeEscalation: false, capabilities drop ALL.
        command = [
            require_tool("setpriv"),
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--no-new-privs",
            "--bounding-set=-all",
            "--inh-caps=-all",
            *command,
        ]
        os.chown(socket_dir, uid, gid)
    else:
        uid = os.getuid()
    namespaced = can_make_read_only_root()
    if namespaced:
        unshare = ["unshare", "--mount", "--propagation", "private"]
        wrapper = ["sh", "-c", READ_ONLY_ROOT, "sh", str(socket_dir), str(image.root)]
        command = [*unshare, *wrapper, *command]
    # Read-only by permissions as well, for a daemon that runs as the test's own user.
    for path in (venv, read_only):
        run(["chmod", "-R", "a-w", path])
    before = snapshot(image.root, skip=socket_dir)

    process = subprocess.Popen(
        command, env=env, cwd=read_only, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    socket_path = socket_dir / "handshake.sock"
    if namespaced:  # the socket lives in the daemon's own mount namespace
        socket_path = Path(f"/proc/{process.pid}/root{socket_path}")
    try:
        yield Daemon(
            process, f"http://127.0.0.1:{port}", socket_path, uid, image.root, socket_dir, before
        )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        for path in (venv, read_only):
            run(["chmod", "-R", "u+w", path])


def wait_for(daemon: Daemon, path: str, status: int = 200) -> str:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    last: tuple[int, str] = (0, "")
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            _, stderr = daemon.process.communicate()
            pytest.fail(f"the daemon exited with {daemon.process.returncode}:\n{stderr}")
        try:
            last = get(daemon.url + path)
        except OSError:
            last = (0, "")
        if last[0] == status:
            return last[1]
        time.sleep(0.1)
    pytest.fail(f"{path} never answered {status}: {last}")


def test_daemon_runs_non_root_on_a_read_only_root(daemon: Daemon) -> None:
    assert wait_for(daemon, "/healthz") == "ok\n"
    metrics = wait_for(daemon, "/metrics")
    assert "kvcap_build_info{" in metrics
    assert re.search(r'kvcap_collector_up\{[^}]*collector="handshake"', metrics), metrics
    wait_for(daemon, "/readyz")  # the vllm_http source has seen its first (refused) poll

    # The process: the image's user, no capabilities, no way to gain privileges.
    status = Path(f"/proc/{daemon.process.pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines())
    assert fields["Uid"].split() == [str(daemon.uid)] * 4
    assert int(fields["CapEff"], 16) == 0
    if os.geteuid() == 0:
        assert fields["NoNewPrivs"].strip() == "1"
        assert int(fields["CapBnd"], 16) == 0

    # The handshake socket: bound in the socket folder, owned by the daemon's user, and
    # a client (vLLM's plugin; root here, as in the example pod) gets messages through.
    info = daemon.socket_path.stat()
    assert stat.S_ISSOCK(info.st_mode)
    assert info.st_uid == daemon.uid
    context = zmq.Context()
    try:
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(f"ipc://{daemon.socket_path}")
        push.send_multipart([b"kvcap.not-a-topic", b"x"])
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        counted = None
        while counted is None and time.monotonic() < deadline:
            counted = re.search(
                r'kvcap_collector_errors_total\{[^}]*collector="handshake"[^}]*\} 1\.0',
                get(daemon.url + "/metrics")[1],
            )
            time.sleep(0.1)
        assert counted, "the handshake source never saw the message"
        push.close()
    finally:
        context.term()

    daemon.process.terminate()
    _, stderr = daemon.process.communicate(timeout=10)
    assert daemon.process.returncode == 0, stderr
    for trouble in ("Traceback", "Read-only file system", "Permission denied"):
        assert trouble not in stderr, stderr
    assert not daemon.written_outside_the_socket_folder()


def test_the_wheel_builds_without_setuptools_warnings(tmp_path: Path) -> None:
    """`pip install .` and the image's `pip wheel` print no deprecation of our metadata."""
    built = run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", tmp_path, ROOT],
        env=build_env(),
    )
    assert built.returncode == 0, built.stderr
    for warning in ("BuildBackendWarning", "SetuptoolsDeprecationWarning", "is deprecated"):
        assert warning not in built.stdout + built.stderr, built.stderr
