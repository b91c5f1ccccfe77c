"""The bytes one linear layer or one expert block holds per worker under a quantization.

Each rule follows the tensors the release's quantization method creates for a layer
(`create_weights`) on a CUDA GPU, before the checkpoint is loaded: the packed weight, its
scales, zero points and group indices, in their dtypes. Shapes are per worker: `k` is the
input size and `outs` the output sizes (one per merged projection) on this rank.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.errors import ConfigError

FP32 = 4
INT32 = 4


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class Quantization:
    """A checkpoint's `quantization_config`, reduced to what decides tensor sizes."""

    method: str  # "none", "fp8", "mxfp4", "awq", "gptq", "ct-wna16", "ct-int8", "ct-fp8", "nvfp4"
    bits: int = 16
    group_size: int = -1
    block: tuple[int, int] | None = None  # FP8 block-wise: (block_n, block_k)
    static_input_scale: bool = False
    act_order: bool = False
    zero_point: bool = False
    channel_scales: bool = False  # per output channel (compressed-tensors W8A8, FP8)
    skipped: tuple[str, ...] = ()  # modules_to_not_convert / ignore patterns

    @property
    def label(self) -> str:
        if self.method == "none":
            return "unquantized"
        if self.method == "fp8":
            return f"fp8 block {self.block[0]}x{self.block[1]}" if self.block else "fp8 per-tensor"
        if self.method in ("awq", "gptq", "ct-wna16"):
            return f"{self.method} {self.bits}-bit group {self.group_size}"
        return self.method

    def attention_scale_bytes(self, dtype_bytes: int) -> int:
        """What each attention layer gains from the method's KV cache scales: q, k, v and
        prob scalars made under the model dtype; compressed-tensors keeps three float32
        scales and three zero points instead."""
        if self.method.startswith("ct-"):
            return 3 * FP32 + 3 * dtype_bytes
        return 4 * dtype_bytes if self.method in ("fp8", "nvfp4") else 0

    @property
    def quantizes_lm_head(self) -> bool:
        """ModelOpt quantizes the LM head like any linear unless its list names it."""
        return self.method == "nvfp4" and not self.skips("lm_head")

    def skips(self, name: str) -> bool:
        """Whether the module named like vLLM's prefix (`model.layers.3.mlp.down_proj`)
        stays unquantized."""
        return any(_matches(name, pattern) for pattern in self.skipped)

    def linear_bytes(self, name: str, shape: LinearShape, dtype_bytes: int) -> int:
        """One linear layer on one rank, bias excluded."""
        if self.method in ("none", "mxfp4") or self.skips(name):
            return sum(shape.outs) * shape.k * dtype_bytes
        rule = _LINEAR_RULES.get(self.method)
        if rule is None:
            raise ConfigError(f"quantization {self.method!r} is not modelled")
        return rule(self, shape, dtype_bytes)

    def expert_bytes(self, shape: ExpertShape, dtype_bytes: int) -> int:
        """One FusedMoE block on one rank: each local expert's w13 (gate and up, 2 x
        inter by hidden) and w2 (hidden by inter), their scales and biases."""
        biases = shape.experts * (2 * shape.inter + shape.hidden) * dtype_bytes
        if self.method == "none" or self.skips("experts"):
            return shape.experts * 3 * shape.hidden * shape.inter * dtype_bytes + (
                biases if shape.bias else 0
            )
        rule = _EXPERT_RULES.get(self.method)
        if rule is None:
            raise ConfigError(f"quantization {self.method!r} of MoE experts is not modelled")
        return rule(self, shape, dtype_bytes) + (biases if shape.bias else 0)


@dataclass(frozen=True, slots=True)
class LinearShape:
    """A linear layer on one rank: input `k`, outputs `outs` (one per merged
    projection); `row`: split along its input, whose full size is `k_full`."""

    k: int
    outs: tuple[int, ...]
    row: bool = False
    k_full: int = 0
    split_outputs: bool = False  # column-parallel over more than one rank
    column: bool = False  # a ColumnParallelLinear (or its merged and QKV kinds)


@dataclass(frozen=True, slots=True)
class ExpertShape:
    """A FusedMoE block on one rank: its local experts and their sizes."""

    experts: int
    hidden: int
    inter: int
    bias: bool = False


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return (
        fnmatch.fnmatchcase(name, pattern)
        or fnmatch.fnmatchcase(name, pattern + ".*")
        or name.endswith("." + pattern)
        or f".{pattern}." in name
    )


def _groups(size: int, group_size: int) -> int:
    """Scale groups along an input of `size`; -1 is one per output channel."""
    return size // group_size if group_size > 0 else 1


def _fp8_linear(q: Quantization, s: LinearShape, dtype_bytes: int) -> int:
    n = sum(s.outs)
    if q.block is not None:
        bn, bk = q.block
        _check_blocks(s, bn, bk)
        return n * s.k + _ceil(n, bn) * _ceil(s.k, bk) * FP32
    inputs = len(s.outs) * FP32 if q.static_input_scale else 0
    return n * s.k + len(s.outs) * FP32 + inputs  # one scale per merged projection


def _check_blocks(s: LinearShape, bn: int, bk: int) -> None:
    """vLLM refuses a block-wise FP8 layer whose rank cuts a block: a row-parallel input,
    or an output split across ranks. A merged column-parallel layer whose projections do
    not fill whole blocks is let through (`allow_fp8_block_shape_mismatch`)."""
    if s.column and len(s.outs) > 1 and any(size % bn for size in s.outs):
        return
    if s.row and s.k != s.k_full and s.k % bk:
        raise ConfigError(
            f"FP8 block-wise: a row-parallel layer's input per rank ({s.k}) is not "
            f"divisible by the block ({bk}); use a smaller --tensor-parallel-size"
        )
    checked = s.outs if s.split_outputs else s.outs[:-1]
    for size in checked:
        if size % bn:
            raise ConfigError(
                f"FP8 block-wise: an output of {size} per rank is not divisible by the block "
                f"({bn}); use a smaller --tensor-parallel-size"
            )


def _awq_linear(q: Quantization, s: LinearShape, dtype_bytes: int) -> int:
    n, pack = sum(s.outs), 32 // q.bits
    groups = _groups(s.k, q.group_size)
    # Packed along the output: (k, n // pack) words, as AWQ's Marlin method shapes them.
    return s.k * (n // pack) * INT32 + groups * (n // pack * INT32 + n * dtype_bytes)


def _gptq_linear(q: Quantization, s: LinearShape, dtype_bytes: int) -> int:
    n, pack = sum(s.outs), 32 // q.bits
    # With act-order, a row-parallel layer keeps the scales of its whole input.
    groups = _groups(s.k_full if q.act_order and s.row else s.k, q.group_size)
    g_idx = s.k * INT32 if q.act_order else 0
    return s.k // pack * n * INT32 + g_idx + groups * (n * dtype_bytes + n // pack * INT32)


def _wna16_linear(q: Quantization, s: LinearShape, dtype_bytes: int) -> int:
    n, pack = sum(s.outs), 32 // q.bits
    groups = _groups(s.k, q.group_size)
    g_idx = s.k * INT32 if q.act_order else 0
    zeros = groups * _ceil(n, pack) * INT32 if q.zero_point else 0
    weight_shape = 2 * 8  # int64 (2,)
    # Packed along the input, rounded up: (n, ceil(k / pack)) words.
    return n * _ceil(s.k, pack) * INT32 + n * groups * dtype_bytes + weight_shape + g_idx + zeros


def _int8_linear(q: Quantization, s: LinearShape, dtype_bytes: int) -> int:
    n = sum(s.outs)
    scales = n * FP32 if q.channel_scales else len(s.outs) * FP32
    return n * s.k + scales + (len(s.outs) * FP32 if q.static_input_scale else 0)


def _nvfp4_linear(q: Quantization, s: LinearShape, dtype_bytes: int) -> int:
    n = sum(s.outs)
    # FP4 pairs per byte, one FP8 scale per 16 inputs, a global and an input scale each.
    return n * s.k // 2 + n * (s.k // 16) + 2 * len(s.outs) * FP32


def _fp8_experts(q: Quantization, s: ExpertShape, dtype_bytes: int) -> int:
    e, h, i = s.experts, s.hidden, s.inter
    if q.block is not None:
        bn, bk = q.block
        scales = 2 * _ceil(i, bn) * _ceil(h, bk) + _ceil(h, bn) * _ceil(i, bk)
        return e * (3 * h * i + scales * FP32)
    inputs = 2 * e * FP32 if q.static_input_scale else 0
    return e * (3 * h * i + 3 * FP32) + inputs


def _mxfp4_experts(q: Quantization, s: ExpertShape, dtype_bytes: int) -> int:
    # The Marlin MXFP4 kernels (what the release picks on Hopper) pad the intermediate
    # size to 128 and the hidden size to 256; the biases follow the padding.
    e, h, i = s.experts, _ceil(s.hidden, 256) * 256, _ceil(s.inter, 128) * 128
    elements = 3 * h * i
    padding = e * (2 * (i - s.inter) + (h - s.hidden)) * dtype_bytes if s.bias else 0
    return e * (elements // 2 + elements // 32) + padding


def _int8_experts(q: Quantization, s: ExpertShape, dtype_bytes: int) -> int:
    h, i = s.hidden, s.inter
    return s.experts * (3 * h * i + (2 * i + h) * FP32)  # one scale per output channel


def _nvfp4_experts(q: Quantization, s: ExpertShape, dtype_bytes: int) -> int:
    elements = 3 * s.hidden * s.inter
    return s.experts * (elements // 2 + elements // 16 + 6 * FP32)


def _packed_experts(q: Quantization, s: ExpertShape, dtype_bytes: int) -> int:
    """AWQ, GPTQ and compressed-tensors WNA16 experts: int32-packed weights, scales
    per group (and zero points, shapes or biases as each method makes them)."""
    e, h, i, pack = s.experts, s.hidden, s.inter, 32 // q.bits
    scales = _groups(h, q.group_size) * 2 * i + _groups(i, q.group_size) * h
    packed = 3 * h * i // pack * INT32 + scales * dtype_bytes
    if q.method == "awq":
        return e * (packed + scales // pack * INT32)
    if q.method == "gptq":
        # GPTQ's Marlin MoE always makes the expert biases (zero until loaded).
        biases = 0 if s.bias else (2 * i + h) * dtype_bytes
        return e * (packed + scales // pack * INT32 + biases)
    shapes = 2 * 2 * dtype_bytes  # w13_weight_shape, w2_weight_shape: (experts, 2)
    zeros = scales // pack * INT32 if q.zero_point else 0
    return e * (packed + shapes + zeros)


_LINEAR_RULES = {
    "fp8": _fp8_linear,
    "awq": _awq_linear,
    "gptq": _gptq_linear,
    "ct-wna16": _wna16_linear,
    "ct-int8": _int8_linear,
    "ct-fp8": _int8_linear,
    "nvfp4": _nvfp4_linear,
}
_EXPERT_RULES = {
    "fp8": _fp8_experts,
    "mxfp4": _mxfp4_experts,
    "awq": _packed_experts,
    "gptq": _packed_experts,
    "ct-wna16": _packed_experts,
    "ct-int8": _int8_experts,
    "ct-fp8": _int8_experts,
    "nvfp4": _nvfp4_experts,
}


def _int(value: Any, default: int) -> int:
    return value if type(value) is int else default


def parse_quantization(config: Mapping[str, Any]) -> Quantization:
    """The `quantization_config` of a config.json (absent: unquantized)."""
    raw = config.get("quantization_config")
    if raw is None:
        text = config.get("text_config")
        raw = text.get("quantization_config") if isinstance(text, Mapping) else None
    if raw is None:
        return Quantization("none")
    if not isinstance(raw, Mapping):
        raise ConfigError("config.json `quantization_config` must be an object")
    method = str(raw.get("quant_method", "")).lower().replace("_", "-")
    skipped = _names(raw.get("modules_to_not_convert")) + _names(raw.get("ignore"))
    nested = raw.get("quantization")  # hf_quant_config.json's layout
    if isinstance(nested, Mapping):
        raw = {**raw, **nested}
        skipped += _names(nested.get("exclude_modules"))
    parse = _PARSERS.get(method)
    if parse is None or (
        method == "modelopt" and str(raw.get("quant_algo", "")).upper() != "NVFP4"
    ):
        raise ConfigError(
            f"quantization_config: quant_method {raw.get('quant_method')!r} is not modelled"
        )
    return parse(raw, skipped)


def _fp8(raw: Mapping[str, Any], skipped: tuple[str, ...]) -> Quantization:
    block = raw.get("weight_block_size")
    pair = None
    if isinstance(block, list) and len(block) == 2 and all(_positive(v) for v in block):
        pair = (int(block[0]), int(block[1]))
    static = raw.get("activation_scheme") == "static"
    return Quantization("fp8", 8, block=pair, static_input_scale=static, skipped=skipped)


def _mxfp4(raw: Mapping[str, Any], skipped: tuple[str, ...]) -> Quantization:
    return Quantization("mxfp4", 4, 32, skipped=skipped)


def _awq(raw: Mapping[str, Any], skipped: tuple[str, ...]) -> Quantization:
    bits = _int(raw.get("bits", raw.get("w_bit")), 4)
    group = _int(raw.get("group_size", raw.get("q_group_size")), 128)
    return _packed("awq", bits, group, zero_point=True, skipped=skipped)


def _gptq(raw: Mapping[str, Any], skipped: tuple[str, ...]) -> Quantization:
    bits, group = _int(raw.get("bits"), 4), _int(raw.get("group_size"), 128)
    act = bool(raw.get("desc_act", False))
    return _packed("gptq", bits, group, act_order=act, skipped=skipped)


def _nvfp4(raw: Mapping[str, Any], skipped: tuple[str, ...]) -> Quantization:
    return Quantization("nvfp4", 4, 16, skipped=skipped)


def _positive(value: Any) -> bool:
    return type(value) is int and 0 < value <= 1 << 20


def _packed(method: str, bits: int, group_size: int, **fields: Any) -> Quantization:
    """An integer-packed method; vLLM's kernels take 4 or 8 bits and groups of -1 (one
    per output channel) or a positive size."""
    if bits not in (4, 8):
        raise ConfigError(f"quantization_config: {method} with {bits} bits is not modelled")
    if group_size != -1 and not _positive(group_size):
        raise ConfigError(f"quantization_config: group_size {group_size} is not -1 or positive")
    return Quantization(method, bits, group_size, **fields)


# Bounds on a checkpoint's list of unquantized modules: real lists name each layer's few
# modules (a few thousand entries at most); every entry is tried against every layer.
MAX_SKIPPED_MODULES = 20_000
MAX_PATTERN_LENGTH = 512


def _names(value: Any) -> tuple[str, ...]:
    names = tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()
    if len(names) > MAX_SKIPPED_MODULES:
        raise ConfigError(
            f"quantization_config: {len(names)} unquantized modules listed (at most "
            f"{MAX_SKIPPED_MODULES})"
        )
    for name in names:
        if len(name) > MAX_PATTERN_LENGTH:
            raise ConfigError(
                f"quantization_config: a module pattern of {len(name)} characters (at most "
                f"{MAX_PATTERN_LENGTH})"
            )
        if name.startswith("re:"):
            try:
                re.compile(name[3:])
            except re.error as error:
                raise ConfigError(f"quantization_config: pattern {name!r}: {error}") from None
    return names


def _compressed_tensors(raw: Mapping[str, Any], skipped: tuple[str, ...]) -> Quantization:
    groups = raw.get("config_groups")
    if not isinstance(groups, Mapping) or len(groups) != 1:
        raise ConfigError("compressed-tensors: one config group is modelled")
    group = next(iter(groups.values()))
    weights = group.get("weights") if isinstance(group, Mapping) else None
    if not isinstance(weights, Mapping):
        raise ConfigError("compressed-tensors: the config group has no `weights`")
    inputs = group.get("input_activations")
    bits = _int(weights.get("num_bits"), 8)
    kind = weights.get("type", "int")
    static = isinstance(inputs, Mapping) and not inputs.get("dynamic", True)
    channel = weights.get("strategy") == "channel"
    if inputs is None and kind == "int" and bits in (4, 8):
        group_size = _int(weights.get("group_size"), -1)
        act = weights.get("actorder") in ("group", "dynamic", True)
        zero = not weights.get("symmetric", True)
        return _packed(
            "ct-wna16", bits, group_size, act_order=act, zero_point=zero, skipped=skipped
        )
    if bits == 8 and kind == "int":
        return Quantization(
            "ct-int8", 8, channel_scales=channel, static_input_scale=static, skipped=skipped
        )
    if bits == 8 and kind == "float":
        return Quantization(
            "ct-fp8", 8, channel_scales=channel, static_input_scale=static, skipped=skipped
        )
    raise ConfigError(f"compressed-tensors: {bits}-bit {kind} weights are not modelled")


_PARSERS = {
    "fp8": _fp8,
    "mxfp4": _mxfp4,
    "awq": _awq,
    "awq-marlin": _awq,
    "gptq": _gptq,
    "gptq-marlin": _gptq,
    "compressed-tensors": _compressed_tensors,
    "modelopt": _nvfp4,
}
