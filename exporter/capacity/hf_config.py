"""Typed, read-only access to a Hugging Face `config.json` the way vLLM reads it."""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any

from exporter.errors import ConfigError

# Keys vLLM looks at to derive the model's maximum length; the smallest one wins
# (config/model.py: _get_and_verify_max_len).
_MAX_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# Used by vLLM when none of the keys above is present.
_DEFAULT_MAX_MODEL_LEN = 2048

# Bounds on config.json integers. Every field the model reads is a size, a count or a
# period, so none is negative. Past int64 no tensor vLLM builds could hold the value, and
# keeping every field below it keeps the products of fields inside float range.
MAX_CONFIG_INT = 2**63 - 1
# The layer count bounds the work: one record per layer. No real model has more than a
# few hundred layers; a million would take ~10 s before any answer.
MAX_LAYERS = 100_000
# Lengths up to this are read (and clamped to MAX_CONFIG_INT): transformers' "no limit" is
# int(1e30); a longer number is nonsense rather than a limit.
_NO_LIMIT = 2**128

# Rope types whose factor does not stretch the context (vLLM leaves the length alone).
# YaRN variants already have the stretched length in max_position_embeddings.
_ROPE_TYPES_WITHOUT_STRETCH = frozenset(
    {"su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling"}
)

# Model types that vLLM serves with multi-head latent attention when kv_lora_rank is set
# (ModelConfig.is_deepseek_mla).
_MLA_MODEL_TYPES = frozenset(
    {
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "deepseek_mtp",
        "kimi_k2",
        "kimi_linear",
        "longcat_flash",
        "glm4_moe_lite",
        "pangu_ultra_moe",
    }
)


# Defaults of the transformers config classes (5.x) for keys a config.json may leave out,
# by model_type: vLLM reads the config object, so a missing key takes these values.
_GATED_DELTA_NET_DEFAULTS: dict[str, Any] = {
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
}
_CONFIG_CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048},
    "mistral": {"sliding_window": 4096, "max_position_embeddings": 131072},
    "mixtral": {"max_position_embeddings": 131072},
    "ministral3": {"head_dim": 128},
    "qwen2": {"max_position_embeddings": 32768, "sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {
        "max_position_embeddings": 32768,
        "head_dim": 128,
        "sliding_window": 4096,
        "max_window_layers": 28,
    },
    "qwen3_moe": {"max_position_embeddings": 32768, "sliding_window": 4096},
    "phi3": {"max_position_embeddings": 4096, "original_max_position_embeddings": 4096},
    "gemma": {"max_position_embeddings": 8192, "head_dim": 256},
    "gemma2": {"max_position_embeddings": 8192, "sliding_window": 4096, "head_dim": 256},
    "gemma3_text": {"max_position_embeddings": 131072, "sliding_window": 4096, "head_dim": 256},
    "cohere": {"max_position_embeddings": 8192},
    "cohere2": {"max_position_embeddings": 8192, "sliding_window": 4096},
    "gpt_oss": {
        "max_position_embeddings": 131072,
        "sliding_window": 128,
        "head_dim": 64,
        "num_key_value_heads": 8,
    },
    "llama4_text": {
        "max_position_embeddings": 131072,
        "head_dim": 128,
        "attention_chunk_size": 8192,
        "num_key_value_heads": 8,
    },
    "deepseek_v2": {"max_position_embeddings": 2048, "kv_lora_rank": 512, "qk_rope_head_dim": 64},
    "deepseek_v3": {"max_position_embeddings": 4096, "kv_lora_rank": 512, "qk_rope_head_dim": 64},
    "jamba": {"max_position_embeddings": 262144, "num_key_value_heads": 8},
    "nemotron_h": {
        "max_position_embeddings": 4096,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "ssm_state_size": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "conv_kernel": 4,
        "mamba_ssm_cache_dtype": "float32",
    },
    "granitemoehybrid": {"max_position_embeddings": 2048},
    "falcon_h1": {"num_key_value_heads": 8, "max_position_embeddings": 8192},
    "zamba2": {
        "max_position_embeddings": 4096,
        "mamba_d_state": 64,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_ngroups": 1,
        "n_mamba_heads": 8,
    },
    "qwen3_next": {
        "max_position_embeddings": 32768,
        "num_key_value_heads": 2,
        "head_dim": 256,
        **_GATED_DELTA_NET_DEFAULTS,
    },
    "qwen3_5_text": {
        "max_position_embeddings": 32768,
        "num_key_value_heads": 4,
        "head_dim": 256,
        **_GATED_DELTA_NET_DEFAULTS,
    },
    "qwen3_5_moe_text": {
        "max_position_embeddings": 32768,
        "num_key_value_heads": 2,
        "head_dim": 256,
        **_GATED_DELTA_NET_DEFAULTS,
    },
    "exaone4": {
        "max_position_embeddings": 2048,
        "sliding_window": 4096,
        "sliding_window_pattern": 4,
    },
    "olmo3": {"max_position_embeddings": 2048, "sliding_window": 4096},
}


def _config_class_view(text: Mapping[str, Any]) -> dict[str, Any]:
    """The config as its transformers class sees it: defaults and derived fields applied."""
    model_type = text.get("model_type")
    view = {**_CONFIG_CLASS_DEFAULTS.get(model_type if isinstance(model_type, str) else "", {})}
    view.update(text)
    hidden, heads = view.get("hidden_size"), view.get("num_attention_heads")
    if model_type == "cohere2" and isinstance(hidden, int) and isinstance(heads, int) and heads:
        view["head_dim"] = hidden // heads  # Cohere2Config always recomputes it
    if model_type == "zamba2":
        if isinstance(hidden, int) and isinstance(heads, int) and heads:
            view.setdefault("attention_head_dim", 2 * hidden // heads)
        if view.get("use_long_context"):
            view["max_position_embeddings"] = 16384
    return view


class HfConfig:
    """A model's config.json. Multimodal configs are read through their `text_config`.

    Getters return Python values and raise `ConfigError` naming the field when a
    required one is missing or has the wrong type, so bad input never becomes a number.
    """

    def __init__(self, raw: Mapping[str, Any]) -> None:
        if not isinstance(raw, Mapping):
            raise ConfigError("config.json must be a JSON object")
        self.raw = raw
        text = raw.get("text_config")
        self.text: Mapping[str, Any] = _config_class_view(
            text if isinstance(text, Mapping) else raw
        )

    @property
    def architecture(self) -> str:
        archs = self.raw.get("architectures")
        if isinstance(archs, list) and archs and isinstance(archs[0], str):
            return archs[0]
        raise ConfigError("config.json has no `architectures` list")

    @property
    def model_type(self) -> str:
        value = self.text.get("model_type", self.raw.get("model_type", ""))
        return value if isinstance(value, str) else ""

    def has(self, key: str) -> bool:
        return self.text.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.text.get(key)
        return default if value is None else value

    def get_int(
        self,
        key: str,
        default: int | None = None,
        *,
        minimum: int = 0,
        maximum: int = MAX_CONFIG_INT,
    ) -> int:
        """An integer field in [minimum, maximum]; a float with no fraction counts.

        Booleans, NaN and Infinity (Python's json reads both) are not integers.
        """
        value = self.text.get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"config.json is missing the integer field `{key}`")
            return default
        if not _is_number(value) or (isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"config.json field `{key}` must be an integer, got {_shown(value)}")
        if value < minimum:
            raise ConfigError(
                f"config.json field `{key}` must be at least {minimum}, got {_shown(value)}"
            )
        if value > maximum:
            raise ConfigError(
                f"config.json field `{key}` must be at most {maximum}, got {_shown(value)}"
            )
        return int(value)

    def positive_int(self, key: str, default: int | None = None) -> int:
        """A count, size or period: anything the model divides by or multiplies out."""
        return self.get_int(key, default, minimum=1)

    def optional_int(self, key: str) -> int | None:
        return self.get_int(key) if self.has(key) else None

    def get_float(self, key: str, default: float | None = None) -> float:
        """A positive, finite number (the float fields read are all scale factors)."""
        value = self.text.get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"config.json is missing the number field `{key}`")
            return default
        if not _is_number(value) or not 0 < value <= MAX_CONFIG_INT:
            raise ConfigError(
                f"config.json field `{key}` must be a positive number up to {MAX_CONFIG_INT}, "
                f"got {_shown(value)}"
            )
        return float(value)

    def optional_str(self, key: str) -> str | None:
        value = self.text.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"config.json field `{key}` must be a string, got {_shown(value)}")
        return value

    def str_list(self, key: str) -> list[str] | None:
        value = self.text.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"config.json field `{key}` must be a list of strings")
        return list(value)

    def int_list(self, key: str) -> list[int] | None:
        value = self.text.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"config.json field `{key}` must be a list of integers")
        return list(value)

    # --- vLLM's generic readings (ModelConfig) -------------------------------------

    def mamba_chunk_size(self) -> int | None:
        """The Mamba kernels' chunk (vLLM's get_mamba_chunk_size), None when not given."""
        return self.optional_int("mamba_chunk_size") or self.optional_int("chunk_size")

    @property
    def num_hidden_layers(self) -> int:
        return self.get_int("num_hidden_layers", minimum=1, maximum=MAX_LAYERS)

    @property
    def num_attention_heads(self) -> int:
        return self.positive_int("num_attention_heads")

    @property
    def is_mla(self) -> bool:
        return self.model_type in _MLA_MODEL_TYPES and self.has("kv_lora_rank")

    def head_size(self) -> int:
        """ModelConfig.get_head_size: the head size vLLM assumes for the whole model."""
        if self.is_mla:
            return self.latent_size()
        if self.model_type == "zamba2":
            return self.positive_int("attention_head_dim")
        if self.has("head_dim"):
            return self.positive_int("head_dim")
        if self.has("hidden_size_per_head"):
            return self.positive_int("hidden_size_per_head")
        return self.hidden_size_per_attention_head()

    def hidden_size_per_attention_head(self) -> int:
        """hidden_size // num_attention_heads, the head size when no field states it."""
        head_size = self.positive_int("hidden_size") // self.num_attention_heads
        if head_size < 1:
            raise ConfigError(
                f"config.json `hidden_size` ({self.get_int('hidden_size')}) is smaller than "
                f"`num_attention_heads` ({self.num_attention_heads}): a head would have no size"
            )
        return head_size

    def latent_size(self) -> int:
        """The MLA latent one token stores: kv_lora_rank plus the RoPE dimensions."""
        return self.positive_int("kv_lora_rank") + self.get_int("qk_rope_head_dim")

    def total_num_kv_heads(self) -> int:
        """ModelConfig.get_total_num_kv_heads (1 for MLA: one latent per token)."""
        if self.is_mla:
            return 1
        for key in ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num"):
            if self.has(key):
                return self.positive_int(key)
        return self.num_attention_heads

    def num_kv_heads_per_rank(self, tensor_parallel_size: int) -> int:
        """KV heads one TP rank stores; heads are replicated when there are fewer than ranks."""
        return max(1, self.total_num_kv_heads() // tensor_parallel_size)

    def model_dtype(self, requested: str) -> str:
        """vLLM's `--dtype auto` on a CUDA GPU: the checkpoint dtype, fp32 downcast to bf16."""
        if requested not in ("auto", ""):
            return {"half": "float16", "float": "float32"}.get(requested, requested)
        value = self.get("torch_dtype", self.raw.get("torch_dtype")) or self.get(
            "dtype", self.raw.get("dtype")
        )
        name = value.removeprefix("torch.") if isinstance(value, str) else "float32"
        if name in ("float32", "float"):
            return "bfloat16"
        return name

    def rope_parameters(self) -> list[Mapping[str, Any]]:
        """RoPE settings, one dict per layer type when they are nested (transformers 5)."""
        rope = self.text.get("rope_scaling") or self.text.get("rope_parameters")
        if not isinstance(rope, Mapping) or not rope:
            return []
        nested = [value for value in rope.values() if isinstance(value, Mapping) and value]
        return nested or [rope]

    def _rope_type(self, rope: Mapping[str, Any]) -> str:
        rope_type = str(rope.get("rope_type", rope.get("type", "default")))
        # Legacy names: "su" is LongRoPE everywhere; Phi3Config also reads "yarn" as LongRoPE.
        if rope_type == "su" or (rope_type == "yarn" and self.model_type == "phi3"):
            return "longrope"
        return rope_type

    def _rope_factor(self, rope: Mapping[str, Any]) -> Any:
        factor = rope.get("factor")
        if factor is not None and not (_is_number(factor) and factor > 0):
            raise ConfigError(
                f"config.json RoPE scaling `factor` must be a positive number, got {_shown(factor)}"
            )
        return factor

    def derived_max_model_len(self) -> int:
        """The model's own maximum length, the ceiling for `--max-model-len`."""
        lengths = [self._length(key) for key in _MAX_LENGTH_KEYS if self.has(key)]
        derived = min(lengths, default=_DEFAULT_MAX_MODEL_LEN)
        # Command-R / Cohere models state their usable length explicitly.
        if self.has("model_max_length"):
            derived = self._length("model_max_length")
        # Gemma 3's 128K is already scaled by its RoPE factor; vLLM does not scale it again.
        # An unbounded length stays unbounded.
        if "gemma3" not in self.model_type and derived < MAX_CONFIG_INT:
            factor: Any = 1.0
            for rope in self.rope_parameters():
                if self._rope_type(rope) not in _ROPE_TYPES_WITHOUT_STRETCH:
                    factor = self._rope_factor(rope) if "factor" in rope else factor
            scaled = derived * (1.0 if factor is None else factor)
            if not 1 <= scaled <= MAX_CONFIG_INT:
                raise ConfigError(
                    f"config.json RoPE scaling `factor` {_shown(factor)} stretches the maximum "
                    f"length {derived} to {_shown(scaled)} tokens (1 to {MAX_CONFIG_INT})"
                )
            return int(scaled)
        return derived

    def _length(self, key: str) -> int:
        """A maximum length. transformers writes int(1e30) for "no limit"; such a length, and
        any past int64, is read as int64's maximum: unbounded, yet a number vLLM would plan."""
        return min(self.get_int(key, minimum=1, maximum=_NO_LIMIT), MAX_CONFIG_INT)

    def default_max_model_len(self) -> int:
        """The length vLLM serves when `--max-model-len` is not given (or is -1, before auto-fit).

        LongRoPE models (Phi-3-128k, Phi-4-mini) default to their pre-training length.
        """
        if any(self._rope_type(rope) == "longrope" for rope in self.rope_parameters()):
            if self.has("original_max_position_embeddings"):
                return self._length("original_max_position_embeddings")
            if self.model_type == "phi3":
                return 4096  # transformers' Phi3Config default
        return self.derived_max_model_len()

    def allows_max_model_len(self, requested: int) -> bool:
        """vLLM accepts a longer `--max-model-len` only up to `model_max_length`."""
        if requested <= self.derived_max_model_len():
            return True
        return self.has("model_max_length") and requested <= self._length("model_max_length")


def _shown(value: Any) -> str:
    """A config value for an error message, cut short: it may be a huge number or a tree."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_CONFIG_INT:
        # repr() of an int past 4300 digits raises ValueError (Python's digit limit).
        return f"an integer of {value.bit_length()} bits"
    return reprlib.repr(value)


def _is_number(value: Any) -> bool:
    """A finite JSON number; `true` is not 1 here."""
    if isinstance(value, bool):
        return False
    # math.isfinite would overflow on a huge int; only floats can be NaN or Infinity.
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
