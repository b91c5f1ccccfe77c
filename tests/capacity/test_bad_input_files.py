"""`kvcap-exporter capacity` on hostile input files (issue 25, item 5): a `--config` YAML
bomb, a device, a FIFO and a 500 MiB config.json are one line naming the file and the
bound, exit 1 (a file kvcap cannot read, as the README says), in bounded memory; a bad
`--cases` line is one error line and the batch goes on."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from exporter.bounded_files import MAX_MODEL_CONFIG_BYTES
from exporter.capacity_cli.cases import MAX_CASE_LINE_BYTES
from tests.capacity.test_explain_log_bad_input import _one_error_line, _run
from tests.conftest import GOLDEN
from tests.test_bounded_files import BILLION_LAUGHS

LLAMA = GOLDEN / "handshake" / "configs" / "llama-3.1-8b"
# The yardstick of docs/reliability.md: a capacity run with its inputs read is ~40 MiB.
MAX_RSS_MIB = 96


def _config_file(folder: Path, kind: str) -> str:
    if kind == "dev-zero":
        return "/dev/zero"
    path = folder / "vllm.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_text(BILLION_LAUGHS)
    return str(path)


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("billion-laughs", r"YAML aliases \(\*name\) are not read"),
        ("dev-zero", "a character device, not a regular file"),
        ("fifo", "a FIFO, not a regular file"),
    ],
)
def test_a_hostile_config_file_is_one_line_naming_it(tmp_path: Path, kind: str, why: str) -> None:
    config = _config_file(tmp_path, kind)
    result = _run(
        "--", "vllm", "serve", str(LLAMA), "--config", config, "--kv-cache-memory-bytes", "10GiB"
    )
    line = _one_error_line(result)
    print(f"--config {kind}: exit {result.returncode}, peak RSS {result.peak_rss_mib:.1f} MiB")
    assert result.returncode == 1
    assert line.startswith(f"kvcap-exporter: error: --config {config}: ")
    assert re.search(why, line)
    assert result.peak_rss_mib < MAX_RSS_MIB


def test_a_500_mib_config_json_is_refused_by_its_size(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    with (model / "config.json").open("wb") as handle:
        handle.truncate(500 * 2**20)
    result = _run(str(model), "--kv-cache-memory-bytes", "10GiB")
    line = _one_error_line(result)
    print(f"500 MiB config.json: exit {result.returncode}, peak {result.peak_rss_mib:.1f} MiB")
    assert result.returncode == 1
    assert f"{model / 'config.json'}: larger than 1 MiB, the most kvcap reads" in line
    assert MAX_MODEL_CONFIG_BYTES == 2**20
    assert result.peak_rss_mib < MAX_RSS_MIB


def test_each_bad_cases_line_is_one_error_line_and_the_batch_goes_on(tmp_path: Path) -> None:
    good = json.loads((GOLDEN / "vllm-0.33-capacity.jsonl").read_text().splitlines()[1])
    record = json.dumps({k: good[k] for k in ("id", "hf_config", "settings")})
    cases = tmp_path / "cases.jsonl"
    with cases.open("wb") as handle:
        handle.write(record.encode() + b"\n")
        handle.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")  # nested 10**5 deep
        handle.write(b'{"id": "x", "hf_config": {"a": ' + b"9" * 5000 + b"}}\n")
        handle.write(b'{"id": "' + b"x" * (MAX_CASE_LINE_BYTES + 10) + b'"}\n')  # past the cap
        handle.write(b'{"id": "\xff"}\n')  # not UTF-8
        handle.write(record.encode() + b"\n")
    result = _run("--cases", str(cases))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 6
    messages = [str(line["error"]["message"]) if "error" in line else "" for line in lines]
    assert (messages[0], messages[5]) == ("", "")
    assert lines[5]["result"] == lines[0]["result"]
    assert "line 2 is not valid JSON: nested deeper than 64 levels" in messages[1]
    assert "line 3 is not valid JSON: an integer of 5,000 digits" in messages[2]
    assert messages[3] == "line 4 is longer than 2 MiB, the most kvcap reads of a case"
    assert messages[4].startswith("line 5 is not valid JSON: ")
    assert {
        (line["id"], line["error"]["type"], line["error"]["kvcap_type"]) for line in lines[1:5]
    } == {(None, "ConfigError", "ConfigError")}
    assert result.peak_rss_mib < MAX_RSS_MIB


def test_a_missing_cases_file_is_one_line() -> None:
    result = _run("--cases", "/nonexistent/cases.jsonl")
    assert result.returncode == 1
    assert "--cases /nonexistent/cases.jsonl: cannot read it" in _one_error_line(result)
