"""What the live suite's background processes share: a log file, and `with` to stop them."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self


class LoggedProcess:
    """A process started by `start()` with its output in `log_path`, stopped on leaving `with`."""

    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def spawn(
        self, command: Sequence[str], env: dict[str, str], **popen: object
    ) -> subprocess.Popen[bytes]:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(  # type: ignore[call-overload]
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                **popen,
            )
        return self.process

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()
