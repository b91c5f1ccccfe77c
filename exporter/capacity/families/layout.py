"""What a model family tells the capacity model: its cache-holding layers, before block sizes."""

from __future__ import annotations

from dataclasses import dataclass

from exporter.capacity.settings import EngineSettings


@dataclass(frozen=True, slots=True)
class AttentionLayer:
    """One attention layer as one worker (TP rank) sees it."""

    name: str
    decoder_index: int  # decides the pipeline stage
    num_kv_heads: int  # per TP rank
    head_size: int
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    mla: bool = False


@dataclass(frozen=True, slots=True)
class MambaLayer:
    """One recurrent-state layer as one worker sees it: its state tensors and dtypes."""

    name: str
    decoder_index: int
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    mamba_type: str
    # Mamba2 mixers (and GDN on Hopper) keep one extra block for prefill checkpoints.
    exports_prefill_checkpoint: bool = False
    # Token alignment of those checkpoints (GDN's FlashInfer prefill kernel: 64).
    checkpoint_alignment: int = 1


CacheLayer = AttentionLayer | MambaLayer


@dataclass(frozen=True, slots=True)
class ModelLayout:
    """Every cache-holding layer of the whole model, in model order."""

    layers: tuple[CacheLayer, ...]
    num_decoder_layers: int
    # vLLM aligns block sizes only for model classes that mix attention and Mamba state.
    is_hybrid: bool = False
    # True when the family was not recognised and a generic rule was applied.
    approximate: bool = False


@dataclass(frozen=True, slots=True)
class BuildContext:
    """Resolved values a family needs to describe its layers."""

    settings: EngineSettings
    model_dtype: str  # e.g. "bfloat16"
    mamba_conv_dtype: str  # `--mamba-cache-dtype`, "auto" resolved to the model dtype
    mamba_ssm_dtype_setting: str  # `--mamba-ssm-cache-dtype` as given ("auto" kept)
    prefix_caching: bool

    @property
    def tp(self) -> int:
        return self.settings.tensor_parallel_size

    def ssm_dtype(self, family_default: str | None = None) -> str:
        """The SSM state dtype: the flag, else the family's default, else the conv dtype."""
        if self.mamba_ssm_dtype_setting != "auto":
            return self.mamba_ssm_dtype_setting
        return family_default or self.mamba_conv_dtype
