"""Weight bytes per worker: the splitting rules and hostile quantization configs."""

from __future__ import annotations

import copy
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from exporter.capacity.weights import ParallelLayout, _pp_indices, weights_per_worker
from exporter.capacity.weights_quantization import parse_quantization
from exporter.capacity_cli import checkpoint_index
from exporter.capacity_cli.inputs import binding_worker_weights
from exporter.collectors.parsing import parse_vllm_serve_args, to_engine_settings
from exporter.errors import ConfigError
from exporter.model_config import ResolvedModel, load_model_config, resolve_model

CASES = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "weights" / "cases.json").read_text(
        encoding="utf-8"
    )
)
GIB = 2**30


def _config(name: str, quantization: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = copy.deepcopy(CASES["configs"][name])
    if quantization:
        config["quantization_config"] = copy.deepcopy(CASES["quantizations"][quantization])
    return config


@pytest.mark.parametrize(
    ("layers", "size", "expected"),
    [
        (32, 2, [(0, 16), (16, 32)]),
        (61, 2, [(0, 31), (31, 61)]),  # the extra layer goes to the first stage
        (10, 4, [(0, 2), (2, 5), (5, 8), (8, 10)]),  # remainder 2 = size - 2: middle stages
        (11, 4, [(0, 3), (3, 6), (6, 9), (9, 11)]),  # remainder 3: all but the last
    ],
)
def test_pipeline_stages_split_as_vllm_splits(
    layers: int, size: int, expected: list[tuple[int, int]]
) -> None:
    assert [_pp_indices(layers, rank, size) for rank in range(size)] == expected


def test_data_parallel_does_not_change_a_worker() -> None:
    config = _config("llama-3.1-8b")
    one = weights_per_worker(config, ParallelLayout(2))
    assert weights_per_worker(config, ParallelLayout(2, data_parallel_size=4)) == one


def test_expert_parallel_spreads_experts_over_tp_times_dp() -> None:
    config = _config("qwen3-30b-a3b")
    tp2 = weights_per_worker(config, ParallelLayout(2, enable_expert_parallel=True))
    tp2_dp2 = weights_per_worker(
        config, ParallelLayout(2, enable_expert_parallel=True, data_parallel_size=2)
    )
    assert tp2_dp2.bytes_per_worker < tp2.bytes_per_worker


def test_quantized_models_are_smaller_per_worker() -> None:
    """The issue's cases: gpt-oss-120b fits one H100, DeepSeek-V3 FP8 fits 8 x H200."""
    gpt_oss = weights_per_worker(_config("gpt-oss-120b", "mxfp4"), ParallelLayout())
    assert 60 * GIB < gpt_oss.bytes_per_worker < 70 * GIB
    deepseek = weights_per_worker(_config("deepseek-v3", "fp8-block"), ParallelLayout(8))
    assert 75 * GIB < deepseek.bytes_per_worker < 85 * GIB
    assert "fp8 block 128x128" in deepseek.source


def test_the_binding_stage_is_the_largest() -> None:
    weights = weights_per_worker(_config("llama-3.2-1b"), ParallelLayout(1, 2))
    assert weights.bytes_per_worker == max(weights.stage_bytes)
    assert weights.binding_stage == weights.stage_bytes.index(max(weights.stage_bytes))
    assert "PP stage" in weights.source


@pytest.mark.parametrize(
    "quantization_config",
    [
        "fp8",
        {"quant_method": "bitsandbytes", "load_in_4bit": True},
        {"quant_method": "compressed-tensors", "config_groups": {}},
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": 3}}},
        {"quant_method": "no-such-method"},
    ],
)
def test_unknown_or_malformed_quantization_is_a_config_error(quantization_config: Any) -> None:
    config = _config("llama-3.1-8b")
    config["quantization_config"] = quantization_config
    with pytest.raises(ConfigError):
        weights_per_worker(config, ParallelLayout())


def test_hostile_quantization_fields_fall_back_or_refuse() -> None:
    """Wrong types in a quantization config never become a size."""
    awq = parse_quantization({"quantization_config": {"quant_method": "awq", "bits": "4"}})
    assert awq.bits == 4  # a string is not read; the default applies
    block = parse_quantization(
        {"quantization_config": {"quant_method": "fp8", "weight_block_size": ["a", 1]}}
    )
    assert block.block is None
    config = _config("llama-3.1-8b")
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 0}
    with pytest.raises(ConfigError):
        weights_per_worker(config, ParallelLayout())


@pytest.mark.parametrize(
    "ignore",
    [["lm_head"] * 20_001, ["x" * 513], ["re:(unclosed"]],
    ids=["too-many", "too-long", "bad-regex"],
)
def test_hostile_ignore_lists_are_refused(ignore: list[str]) -> None:
    config = _config("llama-3.1-8b", "ct-w8a8")
    config["quantization_config"]["ignore"] = ignore
    with pytest.raises(ConfigError, match="quantization_config"):
        weights_per_worker(config, ParallelLayout())


def test_modules_not_converted_stay_in_the_model_dtype() -> None:
    """An `ignore` entry (plain or `re:`) keeps those layers unquantized: larger."""
    plain = weights_per_worker(_config("llama-3.1-8b", "ct-w8a8"), ParallelLayout())
    for pattern in ("down_proj", "re:.*mlp\\.down_proj$"):
        config = _config("llama-3.1-8b", "ct-w8a8")
        config["quantization_config"]["ignore"] = ["lm_head", pattern]
        kept = weights_per_worker(config, ParallelLayout())
        assert kept.bytes_per_worker > plain.bytes_per_worker


def test_indivisible_heads_are_refused_as_vllm_refuses_them() -> None:
    with pytest.raises(ConfigError, match="not divisible"):
        weights_per_worker(_config("qwen2.5-7b"), ParallelLayout(8))  # 28 heads


def test_fp8_blocks_that_a_rank_would_cut_are_refused_as_vllm_refuses_them() -> None:
    """DeepSeek-V2-Lite's dense MLP (10944) split over TP 2 leaves 5472 inputs per rank,
    not a multiple of the 128-wide block: vLLM refuses to build it (golden records)."""
    config = _config("deepseek-v2-lite", "fp8-block")
    assert weights_per_worker(config, ParallelLayout(1)).bytes_per_worker > 0
    with pytest.raises(ConfigError, match="not divisible by the block"):
        weights_per_worker(config, ParallelLayout(2))
    # Granite 4.0-H's Mamba input projection (one group, copied to each rank) splits into
    # 8512 outputs per rank at TP 2.
    granite = _config("granite-4.0-h-small", "fp8-block")
    with pytest.raises(ConfigError, match="output of 8512"):
        weights_per_worker(granite, ParallelLayout(2))


def test_a_multimodal_config_says_its_tower_is_not_counted() -> None:
    text = _config("gemma-3-27b-text")
    multimodal = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text,
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024},
    }
    weights = weights_per_worker(multimodal, ParallelLayout())
    assert weights.bytes_per_worker == weights_per_worker(text, ParallelLayout()).bytes_per_worker
    assert "the vision tower not counted" in weights.source
    language_only = weights_per_worker(multimodal, ParallelLayout(language_model_only=True))
    assert "tower" not in language_only.source


def test_unmodelled_family_is_a_config_error() -> None:
    config = _config("llama-3.1-8b")
    config["model_type"] = "no_such_family"
    with pytest.raises(ConfigError, match="not modelled"):
        weights_per_worker(config, ParallelLayout())


def _folder(tmp_path: Path, config: dict[str, Any], total: int | None = None) -> ResolvedModel:
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if total is not None:
        index = {"metadata": {"total_size": total}, "weight_map": {}}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return resolve_model(str(tmp_path))


def test_capacity_reads_expert_parallel_from_the_vllm_command(tmp_path: Path) -> None:
    model = _folder(tmp_path, _config("qwen3-30b-a3b"))
    vllm = parse_vllm_serve_args(["serve", str(tmp_path), "-tp", "2", "--enable-expert-parallel"])
    weights = binding_worker_weights(
        model, load_model_config(model.config_file), to_engine_settings(vllm), vllm
    )
    expected = weights_per_worker(
        _config("qwen3-30b-a3b"), ParallelLayout(2, enable_expert_parallel=True)
    )
    assert weights.bytes_per_worker == expected.bytes_per_worker
    assert "expert parallel" in weights.source


def test_the_checkpoint_total_is_quoted_and_is_the_fallback(tmp_path: Path) -> None:
    """A modelled family: the computed share, the index's total beside it. A family not
    modelled: the index's total split over the workers, saying why."""
    model = _folder(tmp_path, _config("llama-3.1-8b"), total=16_060_522_496)
    vllm = parse_vllm_serve_args(["serve", str(tmp_path), "-tp", "2"])
    weights = binding_worker_weights(
        model, load_model_config(model.config_file), to_engine_settings(vllm), vllm
    )
    assert weights.bytes_per_worker == 8_064_082_432  # vLLM 0.32's TP rank
    assert weights.checkpoint_total_bytes == 16_060_522_496
    assert weights.exact
    unknown = _config("llama-3.1-8b")
    unknown["model_type"] = "no_such_family"
    (tmp_path / "other").mkdir()
    other = _folder(tmp_path / "other", unknown, total=10_000)
    fallback = binding_worker_weights(
        other, load_model_config(other.config_file), to_engine_settings(vllm), vllm
    )
    assert fallback.bytes_per_worker == 5_000
    assert not fallback.exact  # a checkpoint's total split evenly is not what vLLM allocates
    assert "split evenly over 2 worker(s)" in fallback.source
    assert "not modelled" in fallback.source


@pytest.mark.parametrize("kind", ["fifo", "device", "huge", "deep", "not_json", "wrong_shape"])
def test_a_hostile_checkpoint_index_is_no_total_and_never_waited_on(
    tmp_path: Path, kind: str
) -> None:
    """The index is a file of the model folder kvcap did not choose: a FIFO (open() would
    wait for a writer for good), a device, one past MAX_INDEX_BYTES, or a document not of
    its shape gives no checkpoint total; the computed share stands alone."""
    model = _folder(tmp_path, _config("llama-3.1-8b"))
    index = tmp_path / "model.safetensors.index.json"
    if kind == "fifo":
        os.mkfifo(index)
    elif kind == "device":
        index.symlink_to("/dev/zero")
    elif kind == "huge":
        with index.open("wb") as sparse:  # no disk: a hole past the cap
            sparse.truncate(checkpoint_index.MAX_INDEX_BYTES + 1)
    elif kind == "deep":
        index.write_text('{"metadata": ' + "[" * 100_000 + "]" * 100_000 + "}")
    elif kind == "not_json":
        index.write_bytes(b"\xff{not json")
    else:
        index.write_text(json.dumps({"metadata": {"total_size": "16 GB"}}))
    vllm = parse_vllm_serve_args(["serve", str(tmp_path), "-tp", "2"])
    found: list[Any] = []
    reader = threading.Thread(
        target=lambda: found.append(
            binding_worker_weights(
                model, load_model_config(model.config_file), to_engine_settings(vllm), vllm
            )
        ),
        daemon=True,
    )
    reader.start()
    reader.join(10)  # on a thread: a read that waits on the FIFO fails instead of hanging
    assert len(found) == 1, "the index read did not return"
    assert found[0].checkpoint_total_bytes is None
    assert found[0].bytes_per_worker == 8_064_082_432


@pytest.mark.parametrize(
    ("flags", "language_only"),
    [
        ([], False),
        (["--language-model-only"], True),
        (["--limit-mm-per-prompt", '{"image": 0}'], True),
        (["--limit-mm-per-prompt", '{"image": 2}'], False),
        (["--limit-mm-per-prompt", "not json"], False),
    ],
)
def test_capacity_drops_the_vision_tower_as_vllm_does(
    tmp_path: Path, flags: list[str], language_only: bool
) -> None:
    config = copy.deepcopy(CASES["configs"]["gemma-3-27b-it"])
    model = _folder(tmp_path, config)
    vllm = parse_vllm_serve_args(["serve", str(tmp_path), *flags])
    weights = binding_worker_weights(
        model, load_model_config(model.config_file), to_engine_settings(vllm), vllm
    )
    layout = ParallelLayout(language_model_only=language_only)
    assert weights.bytes_per_worker == weights_per_worker(config, layout).bytes_per_worker
    assert ("vision tower" in weights.source) is not language_only
