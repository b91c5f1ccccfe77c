"""`capacity -- vllm serve ...` reproduces every golden record from its settings written
as a `vllm serve` command line (flags spelled as vLLM spells them)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from exporter import cli
from tests.capacity.test_golden import assert_matches
from tests.conftest import load_golden_cases
from tests.support import cli_command

CASES = load_golden_cases()

# Golden `settings` key -> the `vllm serve` flag that sets it.
FLAGS = {
    "tensor_parallel_size": "-tp",
    "pipeline_parallel_size": "--pipeline-parallel-size",
    "dtype": "--dtype",
    "kv_cache_dtype": "--kv-cache-dtype",
    "block_size": "--block-size",
    "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "num_gpu_blocks_override": "--num-gpu-blocks-override",
    "available_kv_bytes_per_worker": "--kv-cache-memory-bytes",
}


def model_folder(root: Path, config: dict[str, Any]) -> Path:
    text = json.dumps(config, sort_keys=True)
    folder = root / hashlib.sha256(text.encode()).hexdigest()[:16]
    if not folder.is_dir():
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(text, encoding="utf-8")
    return folder


def command_line(case: dict[str, Any], folder: Path) -> list[str]:
    words = ["vllm", "serve", str(folder)]
    for key, value in case["settings"].items():
        if value is not None:
            words += [FLAGS[key], str(value)]
    return words


def as_batch_line(document: dict[str, Any], case_id: str) -> dict[str, Any]:
    """The capacity --json document in the batch mode's shape, for assert_matches."""
    if document["result"] is not None:
        return {"id": case_id, "result": document["result"]}
    error = document["error"]
    message = error.get("vllm_message") or error["message"]
    return {"id": case_id, "error": {"type": error["type"], "message": message}}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


def test_every_golden_setting_has_a_flag() -> None:
    assert {key for case in CASES for key in case["settings"]} <= set(FLAGS)


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_golden_case_as_a_command_line(
    case: dict[str, Any], models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    words = command_line(case, model_folder(models, case["hf_config"]))
    code = cli.main(["capacity", "--json", "--", *words])
    document = json.loads(capsys.readouterr().out)
    assert code == (1 if "error" in case else 0)
    assert_matches(case, as_batch_line(document, case["id"]))
    used = document["used"]
    assert used["kv_cache_memory"]["exact"] is True
    assert used["ignored_flags"] == []
    assert (
        used["settings"]["--tensor-parallel-size"]["value"]
        == (case["settings"]["tensor_parallel_size"])
    )


@pytest.mark.process
def test_a_refused_case_as_a_real_process(models: Path) -> None:
    case = next(c for c in CASES if "error" in c)
    words = command_line(case, model_folder(models, case["hf_config"]))
    run = subprocess.run(
        cli_command("capacity", "--json", "--", *words),
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 1
    document = json.loads(run.stdout)
    assert document["fits"] is False
    assert document["error"]["vllm_message"] == case["error"]["message"]
    longest = document["error"]["longest_max_model_len_that_fits"]
    assert f"estimated maximum model length is {longest}" in case["error"]["message"]
