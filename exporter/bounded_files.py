"""Reading files kvcap did not choose (a `--config` YAML, a model's config.json): regular
files only, size-capped, within a deadline, and YAML without alias expansion.

    read_regular_file(path, max_bytes=MAX_MODEL_CONFIG_BYTES) -> bytes
    read_vllm_config(path) -> str  # a `--config` YAML's text, within MAX_VLLM_CONFIG_BYTES
    read_vllm_config_within(folder, path, as_root=True) -> str  # resolved inside `folder`
    stat_within(folder, path, as_root=True) -> os.stat_result  # of the file that reads
    load_yaml(text) -> Any        # refuses aliases, nesting past 32, more than 10,000 nodes

Every refusal is a `FileRefused` (a ConfigError) whose `reason` is the
kvcap_collector_errors_total label; an OSError (missing, not allowed) is left to the caller,
whose message for it predates these bounds. The bounds are in docs/reliability.md.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
import time
from pathlib import Path
from typing import Any

from exporter.errors import ConfigError

# A vLLM `--config` YAML holds a few dozen flags (a few KiB); 1 MiB is far past any real one.
MAX_VLLM_CONFIG_BYTES = 2**20
# A model's config.json: the largest seen are tens of KiB (multimodal models with a vision
# config); 1 MiB keeps json.loads of the worst shape of it well under the RSS yardstick.
MAX_MODEL_CONFIG_BYTES = 2**20
# The time one read may take: a local file is read in milliseconds; a stalled network
# volume is given up on between chunks instead of holding the poll.
READ_DEADLINE_S = 2.0
# YAML shapes: a vLLM config is a flat mapping, some values one level of lists or mappings.
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 10_000
MAX_YAML_INT_CHARACTERS = 64  # digits, signs and underscores of one integer

_CHUNK_BYTES = 2**16
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
# openat2(2), Linux 5.6: the same number on every architecture; its `resolve` flags.
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_RESOLVE_IN_ROOT = 0x10
_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class FileRefused(ConfigError):
    """A file kvcap will not read as it is: not a regular file, past its size, too slow,
    or a shape past its bounds. `reason` is the collector error counter's label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def naming(self, label: str) -> FileRefused:
        """The same refusal, its message led by what the file is (`--config x.yaml`)."""
        return FileRefused(self.reason, f"{label}: {self}")


def read_regular_file(
    path: str | os.PathLike[str], *, max_bytes: int, deadline_s: float = READ_DEADLINE_S
) -> bytes:
    """The whole content of a regular file of at most `max_bytes`, read within `deadline_s`.

    A FIFO, a device or a socket is refused before it is opened (opening a FIFO blocks
    until a writer comes; /dev/zero never ends), and again after (the path may have been
    swapped in between); O_NONBLOCK keeps that second open from blocking either way. A file
    past the cap is refused whole, never cut: no figure comes from half a file. Raises
    OSError as open() does, ValueError for a path with a NUL byte.
    """
    _refuse_unless_regular(os.stat(path).st_mode)
    return _read_opened(os.open(path, _READ_FLAGS), max_bytes, deadline_s)


def read_file_within(
    folder: Path, path: str, *, as_root: bool, max_bytes: int, deadline_s: float = READ_DEADLINE_S
) -> bytes:
    """`path` resolved by the kernel inside `folder`, then read as read_regular_file reads.

    `as_root`: as a process whose root `folder` is resolves it (absolute links and `..`
    stop at `folder`); else strictly beneath `folder` (a link or `..` that leaves it is
    refused, EXDEV). For the files of another container, seen through /proc/<pid>/root
    and cwd: followed plainly from here, an absolute symlink in that container (`config.yaml
    -> /etc/...`) would be resolved in kvcap's own file system, and kvcap would read its own
    files as the other process's. Where the kernel has no openat2 (before 5.6, or a seccomp
    profile without it), the path is followed plainly, as before it existed.
    """
    located = _locate_within(folder, path, as_root=as_root)
    if located is None:
        return read_regular_file(
            folder / path.lstrip("/"), max_bytes=max_bytes, deadline_s=deadline_s
        )
    try:
        # An O_PATH descriptor opens nothing: a FIFO or a device is refused unopened.
        _refuse_unless_regular(os.fstat(located).st_mode)
        descriptor = os.open(f"/proc/self/fd/{located}", _READ_FLAGS)
    finally:
        os.close(located)
    return _read_opened(descriptor, max_bytes, deadline_s)


def stat_within(folder: Path, path: str, *, as_root: bool) -> os.stat_result:
    """What os.stat says of `path` resolved inside `folder` as read_file_within resolves it,
    so that a file's version is the version of the file read. Raises OSError, ValueError
    (a NUL byte) as os.stat does."""
    located = _locate_within(folder, path, as_root=as_root)
    if located is None:
        return os.stat(folder / path.lstrip("/"))
    try:
        return os.fstat(located)
    finally:
        os.close(located)


def _locate_within(folder: Path, path: str, *, as_root: bool) -> int | None:
    """An O_PATH descriptor of `path` resolved by the kernel inside `folder` (see
    read_file_within); None where the kernel has no openat2."""
    directory = os.open(folder, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        resolve = _RESOLVE_IN_ROOT if as_root else _RESOLVE_BENEATH
        return _openat2(directory, path, os.O_PATH | os.O_CLOEXEC, resolve)
    except _NoOpenat2:
        return None
    finally:
        os.close(directory)


def read_vllm_config(path: str | os.PathLike[str]) -> str:
    """The text of a vLLM `--config` YAML file, within MAX_VLLM_CONFIG_BYTES. Raises
    FileRefused, OSError, or ValueError (not UTF-8) as read_regular_file does."""
    return read_regular_file(path, max_bytes=MAX_VLLM_CONFIG_BYTES).decode("utf-8")


def read_vllm_config_within(folder: Path, path: str, *, as_root: bool) -> str:
    """read_vllm_config for a file of another process, resolved as read_file_within does."""
    data = read_file_within(folder, path, as_root=as_root, max_bytes=MAX_VLLM_CONFIG_BYTES)
    return data.decode("utf-8")


class _NoOpenat2(Exception):
    """The kernel (or a seccomp profile) does not offer openat2."""


class _OpenHow(ctypes.Structure):
    _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))


@functools.cache
def _syscall() -> Any:
    function = ctypes.CDLL(None, use_errno=True).syscall
    function.restype = ctypes.c_long
    return function


def _openat2(directory: int, path: str, flags: int, resolve: int) -> int:
    how = _OpenHow(flags, 0, resolve | _RESOLVE_NO_MAGICLINKS)
    encoded = os.fsencode(path)
    if b"\0" in encoded:
        raise ValueError("embedded null byte")
    descriptor = int(
        _syscall()(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(directory),
            ctypes.c_char_p(encoded),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
    )
    if descriptor < 0:
        number = ctypes.get_errno()
        if number in (errno.ENOSYS, errno.EPERM):
            raise _NoOpenat2
        raise OSError(number, os.strerror(number), path)
    return descriptor


def _read_opened(descriptor: int, max_bytes: int, deadline_s: float) -> bytes:
    try:
        status = os.fstat(descriptor)
        _refuse_unless_regular(status.st_mode)
        if status.st_size > max_bytes:
            raise _too_large(max_bytes, status.st_size)
        return _read_capped(descriptor, max_bytes, deadline_s)
    finally:
        os.close(descriptor)


def _refuse_unless_regular(mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):  # a mistake, not an attack: said as open() says it
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    raise FileRefused("file_not_regular", f"{kind}, not a regular file (kvcap reads only those)")


def _read_capped(descriptor: int, max_bytes: int, deadline_s: float) -> bytes:
    """At most max_bytes + 1 bytes: the one past the cap says the file grew past it."""
    deadline = time.monotonic() + deadline_s
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(descriptor, min(_CHUNK_BYTES, max_bytes + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > max_bytes:
            raise _too_large(max_bytes, None)
        chunks.append(chunk)
        if time.monotonic() > deadline:
            raise FileRefused(
                "file_read_timeout", f"not read within {deadline_s:g} s ({total} bytes read)"
            )


def _too_large(max_bytes: int, size: int | None) -> FileRefused:
    found = f"{size:,} bytes" if size is not None else "it grew while read"
    return FileRefused(
        "file_too_large", f"larger than {_size_text(max_bytes)}, the most kvcap reads ({found})"
    )


def _size_text(count: int) -> str:
    return f"{count // 2**20} MiB" if count % 2**20 == 0 else f"{count:,} bytes"


def load_yaml(text: str) -> Any:
    """A YAML document as yaml.safe_load reads it, within bounds: an alias (`*name`) is
    refused, not expanded (a 1 KiB "billion laughs" of nested aliases expands to GiBs once
    its values are turned into flags), and so is nesting past MAX_YAML_DEPTH or more than
    MAX_YAML_NODES nodes. Raises FileRefused (`file_malformed`) naming the problem."""
    try:
        loader = _bounded_loader()(text)  # the reader refuses unprintable characters here
    except Exception as error:
        text = " ".join(str(error).split())
        raise FileRefused("file_malformed", f"not valid YAML: {text}") from None
    try:
        return loader.get_single_data()
    except FileRefused:
        raise
    except RecursionError:
        raise FileRefused("file_malformed", "not valid YAML: nested too deep") from None
    except Exception as error:  # PyYAML raises plain Python errors for odd tags and numbers
        text = " ".join(str(error).split())
        raise FileRefused("file_malformed", f"not valid YAML: {text}") from None
    finally:
        loader.dispose()


@functools.cache
def _bounded_loader() -> Any:
    """yaml.SafeLoader that counts what it composes; built on first use (PyYAML is slow to
    import, and most command lines have no --config)."""
    import yaml  # noqa: PLC0415 (see above)

    class BoundedSafeLoader(yaml.SafeLoader):
        depth = 0
        nodes = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise FileRefused(
                    "file_malformed",
                    "YAML aliases (*name) are not read: the files kvcap reads need none, and "
                    "expanding them is how a small file becomes a huge document",
                )
            self.nodes += 1
            if self.nodes > MAX_YAML_NODES:
                raise FileRefused(
                    "file_malformed", f"more than {MAX_YAML_NODES:,} YAML nodes, the most read"
                )
            self.depth += 1
            try:
                if self.depth > MAX_YAML_DEPTH:
                    raise FileRefused(
                        "file_malformed", f"YAML nested deeper than {MAX_YAML_DEPTH}, the most read"
                    )
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_yaml_int(self, node: Any) -> Any:
            # YAML 1.1's base-60 integers (`1:0:0:...`) cost quadratic big-integer work in
            # PyYAML: a 1 MiB scalar is minutes of CPU. No setting kvcap reads is one.
            text = str(node.value)
            if ":" in text or len(text) > MAX_YAML_INT_CHARACTERS:
                raise FileRefused(
                    "file_malformed",
                    f"a YAML integer of {len(text):,} characters or in base 60, not read",
                )
            return super().construct_yaml_int(node)

    BoundedSafeLoader.add_constructor("tag:yaml.org,2002:int", BoundedSafeLoader.construct_yaml_int)
    return BoundedSafeLoader
