"""The vLLM API servers of a shared process namespace, seen through /proc: each one's
`vllm serve` command line (its `--config` file read as the process sees it, once per change)
and the Hugging Face cache variables of its environment."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from exporter.bounded_files import FileRefused, read_vllm_config_within
from exporter.collectors.parsing import VllmServeArgs, parse_vllm_serve_args
from exporter.errors import KvcapError, UsageError
from exporter.model_config import file_version_within

# `vllm serve --port`'s default.
VLLM_DEFAULT_PORT = 8000
_Process = TypeVar("_Process")  # what is known of a vLLM process: its arguments, its entry


def discover_serve_args(
    proc: Path = Path("/proc"),
    port: int | None = None,
    command_lines: CommandLines | None = None,
) -> VllmServeArgs | None:
    """The `vllm serve` command line of a process in a shared process namespace, if any.

    With `port`, the server listening there (`--port`, vLLM's default 8000); where no
    command line names it, the only vLLM there is (a proxy or port mapping in between), and
    none when there are several: another server's settings would derive wrong figures.
    `command_lines` keeps what was parsed (and the --config files read) between calls."""
    return _serving(list(_vllm_command_lines(proc, command_lines or CommandLines())), port)


def _serving(found: list[tuple[int | None, _Process]], port: int | None) -> _Process | None:
    """Of the vLLM API servers `found` (listening port, what is known of it), lowest PID
    first: the first on `port` (any without one); where none listens there, the only one."""
    on_port = [known for listening, known in found if port is None or listening == port]
    if on_port:
        return on_port[0]
    return found[0][1] if len(found) == 1 else None


# What huggingface_hub reads to find its cache (hf_cache.hub_cache_dir).
HF_CACHE_VARIABLES = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME")
# A process's environment, read at most this far (the kernel's limit on argv + envp is 2 MiB).
MAX_ENVIRON_BYTES = 2**21


def discover_hf_environ(proc: Path = Path("/proc"), port: int | None = None) -> dict[str, str]:
    """The Hugging Face cache variables of the vLLM API server on `port` (as
    discover_serve_args picks it), where this process may read its environment (the same
    user, or a shared process namespace with the right to); else none."""
    entry = _serving([(listening, entry) for listening, entry, _ in _vllm_processes(proc)], port)
    if entry is None:
        return {}
    try:
        with (entry / "environ").open("rb") as environ:
            text = environ.read(MAX_ENVIRON_BYTES)
    except OSError:
        return {}
    pairs = (item.decode("utf-8", "replace").partition("=") for item in text.split(b"\0"))
    return {k: v for k, _, v in pairs if k in HF_CACHE_VARIABLES and v}


def _vllm_processes(proc: Path) -> Iterator[tuple[int | None, Path, list[str]]]:
    """The listening port, /proc entry and command line of every vLLM API server, lowest
    PID first."""
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return
    for entry in sorted(entries, key=lambda p: int(p.name)):
        try:
            with (entry / "cmdline").open("rb") as cmdline:
                # The kernel's own limit on arguments and environment together.
                argv = cmdline.read(MAX_ENVIRON_BYTES).split(b"\0")
        except OSError:
            continue
        words = [w.decode("utf-8", "replace") for w in argv if w]
        if _looks_like_vllm(words):
            yield _listening_port(words), entry, words


def _vllm_command_lines(
    proc: Path, command_lines: CommandLines
) -> Iterator[tuple[int | None, VllmServeArgs]]:
    """The port and parsed command line of every vLLM API server in /proc, lowest PID
    first."""
    for listening, entry, words in _vllm_processes(proc):
        args = command_lines.parse(words, entry)
        if args is not None:
            yield listening, args
    command_lines.forget_unseen()


class CommandLines:
    """Each vLLM process's parsed command line, kept while its argv and its --config file's
    version (os.stat: device, inode, size, times) stay the same: a poll reads the file
    once per change, not once per poll. Refusals of a file wait in `refused` until the
    poller counts them, once per version of the file."""

    def __init__(self) -> None:
        self._parsed: dict[str, tuple[object, VllmServeArgs | None]] = {}
        self._seen: set[str] = set()
        self.refused: list[FileRefused] = []

    def parse(self, words: list[str], entry: Path) -> VllmServeArgs | None:
        self._seen.add(entry.name)
        try:
            plain = parse_vllm_serve_args(words)
        except KvcapError:
            return None
        if plain.config_file is None:
            return plain
        folder, as_root = _folder_of(entry, plain.config_file)
        key = (tuple(words), file_version_within(folder, plain.config_file, as_root=as_root))
        known = self._parsed.get(entry.name)
        if known is not None and known[0] == key:
            return known[1]
        args = self._with_config_file(words, entry, plain)
        self._parsed[entry.name] = (key, args)
        return args

    def _with_config_file(
        self, words: list[str], entry: Path, plain: VllmServeArgs
    ) -> VllmServeArgs:
        """The arguments with the --config file read as the process sees it (its root,
        its working folder); the command line alone where the file cannot be read from
        here; marked `config_refused` where it is past a bound or holds a bad value."""
        try:
            return parse_vllm_serve_args(words, read_config=_process_file_reader(entry))
        except FileRefused as error:
            refusal = error
        except UsageError as error:  # the command line alone parsed: a value of the file's
            refusal = FileRefused("file_malformed", str(error))
        except KvcapError:  # not readable from here (missing, not allowed)
            return plain
        self.refused.append(refusal)
        return replace(plain, config_refused=str(refusal))

    def forget_unseen(self) -> None:
        """Drop the processes not seen since the last call (they ended)."""
        for name in set(self._parsed) - self._seen:
            del self._parsed[name]
        self._seen.clear()


def _listening_port(words: list[str]) -> int | None:
    """The API server's `--port` (the last one given, as argparse reads it), else vLLM's
    default. It does not change capacity, so the argument parser leaves it alone."""
    port: str | None = str(VLLM_DEFAULT_PORT)
    for index, word in enumerate(words):
        if word == "--port":
            port = words[index + 1] if index + 1 < len(words) else None
        elif word.startswith("--port="):
            port = word.removeprefix("--port=")
    return int(port) if port is not None and port.isdigit() else None


def _folder_of(entry: Path, path: str) -> tuple[Path, bool]:
    """The folder a path a process names starts from, seen from here, and whether that
    folder is the process's root: an absolute path's is its root, a relative one's its
    working folder."""
    return (entry / "root", True) if path.startswith("/") else (entry / "cwd", False)


def _process_file_reader(entry: Path) -> Callable[[str], str]:
    """Reads a file the process names as the process would: an absolute path inside its
    root, a relative one beneath its working folder (bounded_files.read_file_within)."""

    def read(path: str) -> str:
        folder, as_root = _folder_of(entry, path)
        return read_vllm_config_within(folder, path, as_root=as_root)

    return read


def _looks_like_vllm(words: list[str]) -> bool:
    joined = " ".join(words[:4])
    return ("vllm" in joined and " serve" in f" {joined}") or "vllm.entrypoints" in joined
