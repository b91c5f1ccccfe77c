"""`capacity -- vllm serve MODEL --kv-offloading-size N`: the tier under the GPU plan, in text
and JSON, and every bad offload input refused in one line naming the flag (exit 2)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from exporter import cli
from exporter.collectors.parsing import parse_vllm_serve_args
from tests.capacity.test_offload_golden import RECORDS, plan_record

GPT_OSS = Path(__file__).resolve().parent.parent / "fixtures" / "capacity-examples"
GPT_OSS_MODEL = str(GPT_OSS / "gpt-oss-20b-mxfp4")
BASE = ["capacity", "--", "vllm", "serve", GPT_OSS_MODEL, "--kv-cache-memory-bytes", "40GiB"]


def _run(
    capsys: pytest.CaptureFixture[str], *args: str, variables: Sequence[str] = ()
) -> tuple[int, str, str]:
    """`kvcap-exporter capacity -- VARIABLES vllm serve ...`: the variables stand before the
    launcher, as on a shell line."""
    launcher = BASE.index("vllm")
    code = cli.main([*BASE[:launcher], *variables, *BASE[launcher:], *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_tier_is_printed_under_the_gpu_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--kv-offloading-size", "64", "-tp", "2")
    assert code == 0
    gpu, _, tier = out.partition("offload tier (native, cpu")
    assert "GPU KV cache size" in gpu
    # 64 GiB over chunks of one GPU block of both TP workers (2 x 196,608 bytes).
    assert "64 GiB -> 174,762 chunks of 1 block(s), 393,216 bytes each" in tier
    assert "offload group" in tier
    assert "sliding_window" in tier
    assert "full_attention" in tier


def test_json_carries_the_tier(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--json", "--kv-offloading-size", "64", "-tp", "2")
    assert code == 0
    tier = json.loads(out)["result"]["offload"]
    assert tier["num_chunks"] == 174_762
    assert tier["kv_bytes_per_chunk"] == 393_216
    assert [g["kind"] for g in tier["groups"]] == ["sliding_window", "full_attention"]
    # A hit needs only the window's chunks of the sliding group: the group-aware figure is
    # about twice what vLLM's stores (a chunk of both groups per chunk) fill.
    assert tier["stored_tokens"] == 174_762 // 2 * 16
    assert tier["capacity_tokens"] > 1.99 * tier["stored_tokens"]


def test_no_offload_flag_no_tier(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--json")
    assert code == 0
    assert json.loads(out)["result"]["offload"] is None


def test_the_native_connector_by_transfer_config(capsys: pytest.CaptureFixture[str]) -> None:
    config = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"cpu_bytes_to_use": 64 << 30, "blocks_per_chunk": 4},
    }
    code, out, _ = _run(capsys, "--json", "-tp", "2", "--kv-transfer-config", json.dumps(config))
    assert code == 0
    tier = json.loads(out)["result"]["offload"]
    assert tier["blocks_per_chunk"] == 4
    assert tier["num_chunks"] == 174_762 // 4


def test_lmcache_tier_from_its_variables(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(
        capsys,
        "--json",
        "--kv-transfer-config",
        '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}',
        variables=["LMCACHE_MAX_LOCAL_CPU_SIZE=40", "LMCACHE_CHUNK_SIZE=512"],
    )
    tier = json.loads(out)["result"]["offload"]
    assert code == 0
    assert tier["backend"] == "lmcache"
    assert tier["max_local_cpu_size_gb_per_worker"] == 40.0
    assert tier["chunk_size"] == 512
    assert tier["capacity_tokens"] is None


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["--kv-offloading-size", "0"], "--kv-offloading-size"),
        (["--kv-offloading-size", "-4"], "--kv-offloading-size"),
        (["--kv-offloading-size", "nan"], "--kv-offloading-size"),
        (["--kv-offloading-size", "1e300"], "--kv-offloading-size"),
        (
            ["--kv-offloading-size", "64", "--kv-offloading-backend", "disk"],
            "--kv-offloading-backend",
        ),
        (["--kv-transfer-config", "{not json"], "--kv-transfer-config"),
        (["--kv-transfer-config", "[1, 2]"], "--kv-transfer-config"),
        (["--kv-transfer-config", '{"kv_connector": "NoSuchConnector"}'], "--kv-transfer-config"),
        (
            ["--kv-transfer-config", '{"kv_connector": "OffloadingConnector"}'],
            "--kv-transfer-config",
        ),
        (
            [
                "--kv-transfer-config",
                '{"kv_connector_extra_config": {"blocks_per_chunk": 0}}',
                "--kv-offloading-size",
                "8",
            ],
            "--kv-transfer-config",
        ),
        (["--kv-transfer-config", '{"a": "' + "x" * 20_000 + '"}'], "--kv-transfer-config"),
        (  # an integer past any float: math.isfinite raised OverflowError (a traceback)
            [
                "--kv-transfer-config",
                '{"kv_connector": "OffloadingConnector", "kv_connector_extra_config": '
                '{"cpu_bytes_to_use": 1' + "0" * 400 + "}}",
            ],
            "--kv-transfer-config",
        ),
    ],
)
def test_bad_offload_input_is_one_line_naming_the_flag_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], names: str
) -> None:
    code, out, err = _run(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert names in err


def test_a_tier_larger_than_the_host_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["capacity", "--host-memory", "512GiB", *BASE[1:], "--kv-offloading-size", "600"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "--kv-offloading-size" in err
    assert "host" in err
    assert err.count("\n") == 1


def test_bad_lmcache_variable_names_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(
        capsys,
        "--kv-transfer-config",
        '{"kv_connector":"LMCacheConnectorV1"}',
        variables=["LMCACHE_MAX_LOCAL_CPU_SIZE=lots"],
    )
    assert code == 2
    assert "LMCACHE_MAX_LOCAL_CPU_SIZE" in err


def test_the_sweep_takes_the_offload_size(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["capacity", "--json", "--sweep", "kv-offloading-size=8,64", *BASE[1:], "-tp", "2"]
    )
    documents = json.loads(capsys.readouterr().out)
    assert code == 0
    chunks = [d["result"]["offload"]["num_chunks"] for d in documents]
    assert chunks == [(8 << 30) // 393_216, (64 << 30) // 393_216]


def test_a_sweep_row_larger_than_the_host_is_an_error_row(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(
        [
            "capacity",
            "--json",
            "--host-memory",
            "512GiB",
            "--sweep",
            "kv-offloading-size=8,600",
            *BASE[1:],
        ]
    )
    documents = json.loads(capsys.readouterr().out)
    assert code == 0
    assert documents[0]["result"]["offload"]["cpu_bytes"] == 8 << 30
    assert documents[1]["result"] is None
    assert "host" in documents[1]["error"]["message"]


def test_a_golden_record_through_the_command_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The command line plans the same tier as the model does for a recorded engine."""
    record = next(r for _, r in RECORDS if r["model"] == "gemma3" and "result" in r)
    (tmp_path / "config.json").write_text(json.dumps(record["hf_config"]))
    settings = record["settings"]
    code = cli.main(
        [
            "capacity",
            "--json",
            "--vllm-version",
            record["vllm_version"],
            "--",
            "vllm",
            "serve",
            str(tmp_path),
            "--max-model-len",
            str(settings["max_model_len"]),
            "-tp",
            str(settings["tensor_parallel_size"]),
            "--kv-cache-memory-bytes",
            str(settings["available_kv_bytes_per_worker"]),
            "--kv-offloading-size",
            str(settings["kv_offloading_size"]),
            *(
                ["--kv-transfer-config", json.dumps(settings["kv_transfer_config"])]
                if "kv_transfer_config" in settings
                else []
            ),
        ]
    )
    tier = json.loads(capsys.readouterr().out)["result"]["offload"]
    assert code == 0
    assert tier["num_chunks"] == record["result"]["offload"]["num_chunks"]
    assert tier["num_chunks"] == plan_record(record).num_chunks


def test_lmcache_variables_are_bounded() -> None:
    """At most 64 LMCACHE_* assignments are kept, each name and value cut short."""
    assignments = [f"LMCACHE_X{i}={'v' * 1000}" for i in range(100)]
    args = parse_vllm_serve_args([*assignments, "vllm", "serve", "/models/x"])
    assert len(args.lmcache_env) == 64
    assert all(len(value) == 256 for _, value in args.lmcache_env)
    assert args.model == "/models/x"


def test_a_transfer_config_tier_larger_than_the_host_names_that_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {}}
    config["kv_connector_extra_config"] = {"cpu_bytes_to_use": 600 << 30}
    code = cli.main(
        [
            "capacity",
            "--host-memory",
            "512GiB",
            *BASE[1:],
            "--kv-transfer-config",
            json.dumps(config),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("kvcap-exporter: error: --kv-transfer-config cpu_bytes_to_use: 600 GiB")
