"""Reading a FIFO with no writer: the read must end (in a refusal) without waiting for one."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest


def refusal_of_a_fifo(
    fifo: Path, read: Callable[[Path], object], timeout_s: float = 5.0
) -> Exception:
    """Make `fifo` and call `read(fifo)` on a thread: the exception it raised. Fails the test
    when the call blocks (an open() without O_NONBLOCK waits for a writer for good; a writer
    is then opened to let the thread go) or when it returns."""
    os.mkfifo(fifo)
    raised: list[Exception] = []

    def call() -> None:
        try:
            read(fifo)
        except Exception as error:
            raised.append(error)

    reader = threading.Thread(target=call, daemon=True)
    reader.start()
    reader.join(timeout_s)
    if reader.is_alive():
        with open(fifo, "w"):
            pass
        pytest.fail(f"reading the FIFO {fifo} blocked")
    if not raised:
        pytest.fail(f"reading the FIFO {fifo} returned instead of refusing it")
    return raised[0]
