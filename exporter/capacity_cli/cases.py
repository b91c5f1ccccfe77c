"""The records of `capacity --cases FILE`: one JSON object a line, each line within the
bounds of a config.json (its size, nesting and integer digits), a bad line one error."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from exporter.bounded_files import MAX_MODEL_CONFIG_BYTES
from exporter.errors import ConfigError
from exporter.json_documents import NotJson, load_bounded_json

# A case line carries a model's config.json and the settings beside it: the config's
# bound, and as much again for the rest (a golden record is under 50 KiB).
MAX_CASE_LINE_BYTES = 2 * MAX_MODEL_CONFIG_BYTES
_CHUNK_BYTES = 2**16


@dataclass(frozen=True, slots=True)
class BadLine:
    """A --cases line that is no record: its output line is this error."""

    message: str


def case_records(path: Path) -> Iterator[Any]:
    """The decoded record, or the BadLine saying why not, of every line that is not blank.
    The file is streamed (a pipe works too), never held whole; a line past
    MAX_CASE_LINE_BYTES is skipped to its end, unread, and is one BadLine."""
    try:
        handle = path.open("rb")
    except OSError as error:
        raise ConfigError(f"--cases {path}: cannot read it: {error.strerror or error}") from None
    except ValueError as error:  # a NUL byte in the path
        raise ConfigError(f"--cases {path}: cannot read it: {error}") from None
    with handle:
        for number, line in enumerate(_bounded_lines(handle), start=1):
            if line is None:
                yield BadLine(
                    f"line {number} is longer than {MAX_CASE_LINE_BYTES // 2**20} MiB, the "
                    "most kvcap reads of a case"
                )
            elif line.strip():
                yield _record(number, line)


def _record(number: int, line: bytes) -> Any:
    try:
        return load_bounded_json(line)
    except NotJson as error:
        return BadLine(f"line {number} is not valid JSON: {error}")


def _bounded_lines(handle: IO[bytes]) -> Iterator[bytes | None]:
    """Each line without its newline, or None for one past the bound (then read on to
    the next newline in chunks, so it costs no more memory than the bound)."""
    while True:
        line = handle.readline(MAX_CASE_LINE_BYTES + 1)
        if not line:
            return
        if len(line) <= MAX_CASE_LINE_BYTES or line.endswith(b"\n"):
            yield line.rstrip(b"\r\n")
            continue
        while line and not line.endswith(b"\n"):
            line = handle.readline(_CHUNK_BYTES)
        yield None
