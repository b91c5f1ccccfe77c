"""The varied configs as cases for scripts/release_golden.py: one dimension a rule reads, swept.

Not run by CI. The live suite's tiny family configs (tools/live/models.py) fix one value per
dimension; `tools.live.varied.VARIED` sweeps what a CPU engine can vary. Each case here is
a family's config with one dimension changed, so each release's own planning code plans
every value a rule could turn on: the live configs, plus what the live matrix cannot vary
on CPU (KV heads against TP, MLA ranks, a large vocabulary, layer patterns, windows and
chunks at, below and above the block size and the batched tokens, Mamba chunk sizes).
One setting for all (1 GiB of KV memory a worker, `--max-model-len 4096`, or the live
config's longer length), except where the dimension needs TP, a block size or the batched
tokens:

    PYTHONPATH=. .venv/bin/python scripts/release_varied_cases.py \
        --out scripts/release_cases_varied.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.live.models import TINY_MODELS, model_config
from tools.live.varied import VARIED

KV_MEMORY = 1024**3  # bytes of KV cache a worker
MAX_MODEL_LEN = 4096
# A config that takes requests of 8192 tokens (the live Gemma 3 window sweep's length).
_LONG: dict[str, Any] = {"max_position_embeddings": 8192}


@dataclass(frozen=True)
class Varied:
    """One varied config and the settings it is planned with (None: vLLM's default)."""

    name: str
    family: str
    overrides: dict[str, Any] = field(default_factory=dict)
    max_model_len: int = MAX_MODEL_LEN
    tensor_parallel_size: int = 1
    block_size: int | None = None
    max_num_batched_tokens: int | None = None


def _live_configs() -> list[Varied]:
    """The live matrix's varied configs, at 4096 tokens or the longer length they need."""
    return [
        Varied(c.name, c.family, c.overrides, max(MAX_MODEL_LEN, c.max_model_len))
        for c in VARIED.values()
    ]


def _kv_heads_by_tp() -> list[Varied]:
    """Llama with 2 KV heads (replicated from TP 4) and 8 (Llama 3 8B / 70B) at TP 1-8;
    8 query heads, so each TP divides them."""
    return [
        Varied(
            f"llama.num_key_value_heads={kv}",
            "llama",
            {"num_attention_heads": 8, "hidden_size": 256, "num_key_value_heads": kv},
            tensor_parallel_size=tp,
        )
        for kv in (2, 8)
        for tp in (1, 2, 4, 8)
    ]


def _one(family: str, dimension: str, value: Any, **overrides: Any) -> Varied:
    """`family` with `dimension` set to `value` (and the keys that must change with it)."""
    return Varied(f"{family}.{dimension}={value}", family, {dimension: value, **overrides})


def _beyond_live() -> list[Varied]:
    """What a CPU engine cannot vary (its kernels take one value) or the live suite does
    not: each comment names the real checkpoints or the edge a rule turns on."""
    return [
        # DeepSeek-V2/V3: kv_lora_rank 512, rope dims 64; smaller latent and rope parts
        # (nope / v head dims stay DeepSeek's 128, which CUDA's MLA prefill takes).
        _one("deepseek_mla", "kv_lora_rank", 256),
        _one("deepseek_mla", "qk_rope_head_dim", 32),
        # Gemma 3's 262,144-token vocabulary: no rule reads the vocabulary.
        _one("llama", "vocab_size", 262144),
        # Gemma 3 is 5:1 (the family's); Gemma 2's 1:1.
        _one("gemma3", "sliding_window_pattern", 2),
        # Jamba-mini: attention every 8th layer from layer 4; and every 2nd.
        _one("jamba", "attn_layer_period", 2, attn_layer_offset=1),
        _one("jamba", "attn_layer_period", 8, attn_layer_offset=4, num_hidden_layers=8),
        # Nemotron-H with its attention layer first (the family's is last).
        _one("nemotron_h", "hybrid_override_pattern", "*M-M"),
        # Windows below and at CUDA's 16-token block, at an explicit 32-token block, and
        # above 2048 batched tokens; 8192 tokens, as the live window sweep.
        Varied("gemma3.sliding_window=8", "gemma3", {"sliding_window": 8, **_LONG}, 8192),
        Varied("gemma3.sliding_window=16", "gemma3", {"sliding_window": 16, **_LONG}, 8192),
        Varied(
            "gemma3.sliding_window=32",
            "gemma3",
            {"sliding_window": 32, **_LONG},
            8192,
            block_size=32,
        ),
        Varied(
            "gemma3.sliding_window=3000",
            "gemma3",
            {"sliding_window": 3000, **_LONG},
            8192,
            max_num_batched_tokens=2048,
        ),
        _one("phi3", "sliding_window", 16),
        # Chunked local attention at CUDA's and the CPU's default blocks.
        _one("llama4", "attention_chunk_size", 16),
        _one("llama4", "attention_chunk_size", 128),
        # Mamba2 chunk sizes (the prefill checkpoint block of 0.32 reads it): 128, not 256.
        _one("nemotron_h", "chunk_size", 128),
        _one("granite_4_h", "mamba_chunk_size", 128),
    ]


# The families whose dimensions are swept, as they are: each sweep's base value.
BASE_FAMILIES = (
    "llama",
    "gemma3",
    "phi3",
    "llama4",
    "qwen3_next",
    "nemotron_h",
    "granite_4_h",
    "falcon_h1",
    "jamba",
    "deepseek_mla",
)


def varied_configs() -> list[Varied]:
    """Every varied config: the families as they are, the live sweeps, the rest."""
    bases = [Varied(family, family) for family in BASE_FAMILIES]
    return [*bases, *_live_configs(), *_kv_heads_by_tp(), *_beyond_live()]


def _setting(value: int | None) -> str:
    return "default" if value is None else str(value)


def case_of(config: Varied) -> dict[str, Any]:
    """One varied config as a release_golden.py case (only the flags it sets)."""
    assert config.family in TINY_MODELS, config.family
    settings: dict[str, Any] = {
        "max_model_len": config.max_model_len,
        "available_kv_bytes_per_worker": KV_MEMORY,
    }
    if config.tensor_parallel_size != 1:
        settings["tensor_parallel_size"] = config.tensor_parallel_size
    if config.block_size is not None:
        settings["block_size"] = config.block_size
    if config.max_num_batched_tokens is not None:
        settings["max_num_batched_tokens"] = config.max_num_batched_tokens
    case_id = "|".join(
        (
            config.name,
            f"tp{config.tensor_parallel_size}",
            f"bs-{_setting(config.block_size)}",
            f"mml-{config.max_model_len}",
            f"mnbt-{_setting(config.max_num_batched_tokens)}",
            "mem-1GiB",
        )
    )
    return {
        "id": case_id,
        "model": config.family,
        "hf_config": model_config(config.family, **config.overrides),
        "settings": settings,
    }


def varied_cases() -> list[dict[str, Any]]:
    """Every varied config as a case, ids unique."""
    cases = [case_of(config) for config in varied_configs()]
    ids = [case["id"] for case in cases]
    if len(set(ids)) != len(ids):
        raise ValueError("two varied configs have the same id")
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the cases JSON to write")
    args = parser.parse_args()
    cases = varied_cases()
    args.out.write_text(json.dumps(cases, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
