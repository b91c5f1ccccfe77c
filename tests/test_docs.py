"""The commands shown in docs/capacity.md print what the page says they print."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.support import cli_command

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```console\n\$ (?P<command>.+?)\n(?P<output>.*?)```", re.DOTALL)


def console_blocks(page: Path) -> list[tuple[str, list[str]]]:
    text = page.read_text(encoding="utf-8")
    return [
        (match["command"], match["output"].strip().splitlines()) for match in BLOCK.finditer(text)
    ]


BLOCKS = console_blocks(ROOT / "docs" / "capacity.md")


def test_the_page_has_an_example_per_attention_kind() -> None:
    assert len(BLOCKS) >= 5


@pytest.mark.process
@pytest.mark.parametrize(("command", "expected"), BLOCKS, ids=[c for c, _ in BLOCKS])
def test_documented_command_output(command: str, expected: list[str]) -> None:
    argv = shlex.split(command)
    assert argv[0] == "kvcap-exporter"
    run = subprocess.run(
        cli_command(*argv[1:]),
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert_shown(run.stdout.splitlines(), expected)


def assert_shown(actual: list[str], expected: list[str]) -> None:
    """The documented lines, in order; a `...` line stands for lines left out of the page."""
    position = 0
    skipping = False
    for line in expected:
        if line == "...":
            skipping = True
            continue
        if skipping:
            assert line in actual[position:], f"{line!r} is not in the output after line {position}"
            position = actual.index(line, position)
        else:
            assert position < len(actual), f"the output ends before {line!r}"
            assert actual[position] == line
        position += 1
        skipping = False


def test_elided_lines_still_have_to_match() -> None:
    assert_shown(["a", "b", "c", "d"], ["a", "...", "c"])
    with pytest.raises(AssertionError):
        assert_shown(["a", "b", "c"], ["a", "c"])
    with pytest.raises(AssertionError):
        assert_shown(["a", "b", "c"], ["a", "...", "x"])
