"""Group layers into KV cache groups that share one block pool (vLLM's kv_cache_planning)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from exporter.capacity.releases import RuleSet
from exporter.capacity.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KvCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RequestLimits,
    SlidingWindowSpec,
    cdiv,
)
from exporter.errors import UnsupportedConfiguration
from exporter.merging import converted


@dataclass(frozen=True, slots=True)
class GroupLayer:
    name: str
    decoder_index: int
    spec: KvCacheSpec


@dataclass(frozen=True, slots=True)
class KvCacheGroup:
    """Layers that allocate blocks together. `spec` is the first layer's, as the scheduler sees."""

    layers: tuple[GroupLayer, ...]

    @property
    def spec(self) -> KvCacheSpec:
        return self.layers[0].spec

    def blocks_per_request(self, limits: RequestLimits) -> int:
        # Layers of one group share a block table, so the costliest layer decides.
        return max(layer.spec.blocks_per_request(limits) for layer in self.layers)

    def max_memory_usage_bytes(self, limits: RequestLimits) -> int:
        return self.spec.max_memory_usage_bytes(limits)


def group_layers(layers: Sequence[GroupLayer], release: RuleSet) -> list[KvCacheGroup]:
    """vLLM's get_kv_cache_groups for the hybrid KV cache manager (the default), as
    `release` forms them."""
    if not layers:
        return []
    specs = [layer.spec for layer in layers]
    if all(spec == specs[0] for spec in specs):
        return [KvCacheGroup(tuple(layers))]
    if release.uniform_type_group and _uniform_type(specs):
        return [KvCacheGroup(tuple(layers))]
    if release.page_size_unification:
        layers = _unify_page_size(layers, padding=release.page_padding)
    elif len({spec.page_size_bytes for spec in specs}) > 1:
        raise UnsupportedConfiguration(
            f"vLLM {release.name} plans only layers with one page size (pages of "
            f"{sorted({spec.page_size_bytes for spec in specs})} B)",
            vllm_error_type="NotImplementedError",
        )
    groups = _group_uniform_page_size(layers, release)
    if release.groups_sorted_by_spec:
        groups.sort(key=lambda group: _spec_order(group.spec))
    return groups


def _spec_order(spec: KvCacheSpec) -> tuple[object, ...]:
    """vLLM 0.10's sort key: the spec class name, then its fields in declaration order
    (block size, then KV heads and head size, or the Mamba state shapes)."""
    if isinstance(spec, MambaSpec):
        return (spec.spec_type, spec.block_size, spec.shapes)
    assert isinstance(spec, AttentionSpec)
    return (spec.spec_type, spec.block_size, spec.num_kv_heads, spec.head_size)


def unify_hybrid_specs(layers: Sequence[GroupLayer]) -> list[GroupLayer]:
    """The hybrid manager off: sliding-window and chunked layers beside full attention
    keep every token, as full attention does (vLLM's unify_hybrid_kv_cache_specs)."""
    specs = [layer.spec for layer in layers]
    if all(spec == specs[0] for spec in specs) or _uniform_type(specs):
        return list(layers)
    local = (SlidingWindowSpec, ChunkedLocalAttentionSpec)
    has_full = any(isinstance(spec, FullAttentionSpec) for spec in specs)
    unified = list(layers)
    if has_full and any(isinstance(spec, local) for spec in specs):
        unified = [
            replace(layer, spec=_as_full_attention(layer.spec))
            if isinstance(layer.spec, local)
            else layer
            for layer in layers
        ]
    specs = [layer.spec for layer in unified]
    if not (all(spec == specs[0] for spec in specs) or _uniform_type(specs)):
        raise UnsupportedConfiguration(
            "Hybrid KV cache manager is disabled but failed to convert the KV cache specs "
            "to one unified type."
        )
    return unified


def _as_full_attention(spec: KvCacheSpec) -> FullAttentionSpec:
    assert isinstance(spec, AttentionSpec)
    return converted(spec, FullAttentionSpec)  # the page fields every attention spec has


def _uniform_type(specs: Sequence[KvCacheSpec]) -> bool:
    """True when every layer can live in one group even though specs differ (e.g. head sizes)."""
    first = specs[0]
    if any(spec.block_size != first.block_size for spec in specs):
        return False
    if any(type(spec).base_type != type(first).base_type for spec in specs):
        return False
    if isinstance(first, SlidingWindowSpec):
        return all(
            isinstance(s, SlidingWindowSpec) and s.sliding_window == first.sliding_window
            for s in specs
        )
    if isinstance(first, MambaSpec):
        return all(
            isinstance(s, MambaSpec)
            and s.page_size_bytes == first.page_size_bytes
            and s.prefill_checkpoint_blocks == first.prefill_checkpoint_blocks
            and s.speculative_blocks == first.speculative_blocks
            for s in specs
        )
    # Full-attention family (full and MLA) mix freely; chunked needs one chunk size.
    chunks = {getattr(s, "attention_chunk_size", None) for s in specs}
    return len(chunks) == 1


def _unify_page_size(layers: Sequence[GroupLayer], *, padding: bool) -> list[GroupLayer]:
    """Make every page the largest page: grow attention blocks or pad the rest (before
    0.24 a page that does not divide the largest is refused)."""
    largest = max(layer.spec.page_size_bytes for layer in layers)
    unified: list[GroupLayer] = []
    for layer in layers:
        spec = layer.spec
        page = spec.page_size_bytes
        if page == largest:
            unified.append(layer)
            continue
        new_spec: KvCacheSpec
        if largest % page and not padding:
            # The release's own words (here: a page of `page` bytes beside `largest`).
            raise UnsupportedConfiguration(
                "The page size of the layer is not divisible by the maximum page size. "
                "Cannot unify by adjusting block_size.",
                vllm_error_type="NotImplementedError",
            )
        if isinstance(spec, MambaSpec):
            new_spec = replace(spec, page_size_padded=largest)
        elif largest % page == 0:
            new_spec = spec.with_block_size(spec.block_size * (largest // page))
        elif isinstance(spec, MLAAttentionSpec):
            raise UnsupportedConfiguration(
                "the layers' KV cache page sizes cannot be unified (latent attention page "
                f"{page} B does not divide {largest} B)"
            )
        else:
            assert isinstance(spec, AttentionSpec)
            new_spec = replace(spec, page_size_padded=largest)
        unified.append(replace(layer, spec=new_spec))
    return unified


def _group_uniform_page_size(layers: Sequence[GroupLayer], release: RuleSet) -> list[KvCacheGroup]:
    """Split same-spec buckets into groups of about the smallest bucket's size.

    A bucket is cut into strided slices (layers i, i+k, i+2k, ...) so each pipeline
    stage gets a share of every group (before 0.11: contiguous slices).
    """
    buckets: dict[KvCacheSpec, list[GroupLayer]] = {}
    for layer in layers:
        buckets.setdefault(layer.spec, []).append(layer)
    sizes = [len(bucket) for bucket in buckets.values()]
    smallest, largest = min(sizes), max(sizes)
    # Nearly equal buckets share one group size; otherwise the smallest bucket sets it
    # and the larger buckets are split (the rest of a shared block is padding).
    ratio = release.group_size_ratio
    group_size = largest if ratio is not None and largest < ratio * smallest else smallest
    groups: list[KvCacheGroup] = []
    for bucket in buckets.values():
        slices = cdiv(len(bucket), group_size)
        if release.strided_groups:
            groups.extend(KvCacheGroup(tuple(bucket[i::slices])) for i in range(slices))
        else:
            groups.extend(
                KvCacheGroup(tuple(bucket[i : i + group_size]))
                for i in range(0, len(bucket), group_size)
            )
    return groups
