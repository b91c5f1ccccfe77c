"""Stand-ins for the parts of vLLM 0.33 the plugin touches, built from the golden handshakes.

They are NOT vLLM: plain classes with the same module path (`vllm.v1.engine.core`), class
names, method names and signatures as vLLM 0.33.0's `EngineCore._initialize_kv_caches(self,
vllm_config) -> KVCacheConfig`, `EngineCoreProc._make_ready_response(self) ->
EngineCoreReadyResponse` and `EngineCore.shutdown(self)` (inherited by `EngineCoreProc`, as in
0.33), and KV cache specs named like vLLM's, with vLLM's formulas for the bytes a request
needs. The ready response is decoded from the golden bytes vLLM's encoder produced.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import msgspec

from tests.conftest import GOLDEN

HANDSHAKES = GOLDEN / "handshake"
DEPLOYMENTS = sorted(path.stem for path in HANDSHAKES.glob("*.json"))
# vLLM reads the window from the model's config; the golden group list does not carry it.
SLIDING_WINDOWS = {"gemma-3-27b-text": 1024}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- vllm/v1/kv_cache_interface.py ---------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec:
    block_size: int
    page_size: int  # stand-in only: vLLM computes it from heads, head size and dtype

    @property
    def page_size_bytes(self) -> int:
        return self.page_size


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(KVCacheSpec):
    sliding_window: int | None = None
    attention_chunk_size: int | None = None

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        return cdiv(vllm_config.model_config.max_model_len, self.block_size) * self.page_size


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(KVCacheSpec):
    sliding_window: int

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        tokens = min(
            self.sliding_window - 1 + vllm_config.max_in_flight_tokens,
            vllm_config.model_config.max_model_len,
        )
        return (cdiv(tokens, self.block_size) + 1) * self.page_size


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    num_speculative_blocks: int = 0

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        assert vllm_config.cache_config.mamba_cache_mode == "align"
        return self.page_size * (2 + self.num_speculative_blocks)


@dataclass(frozen=True, kw_only=True)
class BrokenSpec:
    """A spec from a future vLLM: it has a block size but no `page_size_bytes`."""

    block_size: int


@dataclass
class KVCacheTensor:
    size: int
    layers: list[str]
    layer_stride: int
    block_stride: int
    offset: int = 0
    host_resident: bool = False


@dataclass
class KVCacheGroupSpec:
    layer_names: list[str]
    kv_cache_spec: Any


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]


# --- vllm/v1/engine/__init__.py ------------------------------------------------------------


@dataclass
class EngineCoreReadyResponse:
    """vLLM 0.33's fields, in its order (msgspec encodes a dataclass as a map of them)."""

    max_model_len: int
    num_gpu_blocks: int
    block_size: int
    dp_stats_address: str | None
    dtype: str
    vllm_version: str
    world_size: int
    data_parallel_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    decode_context_parallel_size: int
    data_parallel_rank: int
    max_num_seqs: int
    max_num_batched_tokens: int
    instance_id: str
    supports_lora: bool
    max_loras: int
    mamba_block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_max_concurrency: float | None = None
    kv_events_config: dict[str, Any] | None = None
    weight_transfer_backend: str | None = None
    enable_sleep_mode: bool = False
    supports_draft_weight_updates: bool = False
    effective_attention_block_size: int | None = None
    coord_store_port: int = 0
    coordinator_input_address: str | None = None
    coordinator_output_address: str | None = None


# --- vllm/config ---------------------------------------------------------------------------


def vllm_config(deployment: str) -> types.SimpleNamespace:
    """The VllmConfig attributes the plugin reads, with the deployment's values."""
    spec = json.loads((HANDSHAKES / f"{deployment}.json").read_text(encoding="utf-8"))
    settings, engine = spec["settings"], spec["engines"][0]
    section = types.SimpleNamespace
    return section(
        model_config=section(
            model=f"/models/{spec['model']}",
            served_model_name=spec["served_model_name"],
            max_model_len=engine["max_model_len"],
        ),
        cache_config=section(
            block_size=engine["block_size"],
            cache_dtype=settings["kv_cache_dtype"],
            enable_prefix_caching=True,
            num_gpu_blocks_override=settings["num_gpu_blocks_override"],
            mamba_cache_mode="align",
        ),
        parallel_config=section(
            tensor_parallel_size=settings["tensor_parallel_size"],
            pipeline_parallel_size=settings["pipeline_parallel_size"],
        ),
        scheduler_config=section(max_num_batched_tokens=engine["max_num_batched_tokens"]),
        max_in_flight_tokens=(settings["pipeline_parallel_size"] + 1)
        * engine["max_num_batched_tokens"],
        instance_id=spec["instance_id"],
    )


def golden(deployment: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(
        (HANDSHAKES / f"{deployment}.json").read_text(encoding="utf-8")
    )
    return loaded


def ready_bytes(deployment: str, engine: int = 0) -> bytes:
    return (HANDSHAKES / f"{deployment}.engine{engine}.msgpack").read_bytes()


def kv_cache_config(deployment: str, *, broken: bool = False) -> KVCacheConfig:
    """The scheduler KVCacheConfig vLLM 0.33 would return for the deployment's engine 0."""
    engine = golden(deployment)["engines"][0]
    window = SLIDING_WINDOWS.get(golden(deployment)["model"])
    groups = []
    for index, group in enumerate(engine["groups"]):
        common = {"block_size": group["block_size"], "page_size": group["page_size_bytes"]}
        spec: Any
        if broken:
            spec = BrokenSpec(block_size=group["block_size"])
        elif group["spec_type"] == "SlidingWindowSpec":
            assert window is not None
            spec = SlidingWindowSpec(sliding_window=window, **common)
        elif group["spec_type"] == "MambaSpec":
            states = group["max_memory_usage_bytes_per_request"] // group["page_size_bytes"]
            spec = MambaSpec(num_speculative_blocks=states - 2, **common)
        else:
            spec = FullAttentionSpec(**common)
        names = [f"model.layers.{index}.{n}" for n in range(group["num_layers"])]
        groups.append(KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec))
    # 0.33: every tensor views the one backing allocation of bytes_per_block * num_blocks.
    size = engine["bytes_per_block_per_worker"] * engine["num_gpu_blocks"]
    tensors = [
        KVCacheTensor(size=size, layers=g.layer_names, layer_stride=0, block_stride=0)
        for g in groups
    ]
    return KVCacheConfig(engine["num_gpu_blocks"], tensors, groups)


# --- vllm/v1/engine/core.py ----------------------------------------------------------------


@dataclass
class Calls:
    """What the stand-in engine's own methods did, so tests can see vLLM's path ran."""

    kv_cache_configs: list[KVCacheConfig] = field(default_factory=list)
    ready_responses: list[EngineCoreReadyResponse] = field(default_factory=list)
    shutdowns: int = 0


def engine_core_module(
    deployment: str,
    *,
    broken_specs: bool = False,
    without: tuple[str, ...] = (),
) -> types.ModuleType:
    """A fresh `vllm.v1.engine.core` with new classes, so patches never outlive a test.

    `without` names what this vLLM lacks: "EngineCoreProc", or "EngineCore.<method>".
    """

    class EngineCore:
        def __init__(self, vllm_config: Any) -> None:
            self.vllm_config = vllm_config
            self.calls = Calls()
            # As in vLLM: KV init runs inside the constructor (a vLLM without it skips it).
            initialize = getattr(self, "_initialize_kv_caches", None)
            if initialize is not None:
                initialize(vllm_config)

        def _initialize_kv_caches(self, vllm_config: Any) -> KVCacheConfig:
            config = kv_cache_config(deployment, broken=broken_specs)
            self.calls.kv_cache_configs.append(config)
            return config

        def shutdown(self) -> None:
            self.calls.shutdowns += 1

    class EngineCoreProc(EngineCore):
        def __init__(self, vllm_config: Any, *, engine_index: int = 0) -> None:
            super().__init__(vllm_config)
            self.engine_index = engine_index

        def _make_ready_response(self) -> EngineCoreReadyResponse:
            raw = ready_bytes(deployment, self.engine_index)
            response = msgspec.msgpack.decode(raw, type=EngineCoreReadyResponse)
            self.calls.ready_responses.append(response)
            return response

    module = types.ModuleType("vllm.v1.engine.core")
    module.EngineCore = EngineCore  # type: ignore[attr-defined]
    if "EngineCoreProc" not in without:
        module.EngineCoreProc = EngineCoreProc  # type: ignore[attr-defined]
    for name in without:
        _, _, method = name.partition(".")
        if method:
            delattr(EngineCore, method)
    return module


def engine(module: types.ModuleType, deployment: str, engine_index: int = 0) -> Any:
    """An engine core process's engine, constructed (KV caches initialized) as vLLM does."""
    return module.EngineCoreProc(vllm_config(deployment), engine_index=engine_index)


def install(monkeypatch: Any, module: types.ModuleType) -> None:
    """Put the stand-in into sys.modules as vllm.v1.engine.core, with its parent packages."""
    packages = {name: types.ModuleType(name) for name in ("vllm", "vllm.v1", "vllm.v1.engine")}
    packages["vllm"].v1 = packages["vllm.v1"]  # type: ignore[attr-defined]
    packages["vllm.v1"].engine = packages["vllm.v1.engine"]  # type: ignore[attr-defined]
    packages["vllm.v1.engine"].core = module  # type: ignore[attr-defined]
    for name, package in {**packages, "vllm.v1.engine.core": module}.items():
        monkeypatch.setitem(sys.modules, name, package)


def offloading_vllm_config(
    record: dict[str, Any], *, backend: str = "native"
) -> types.SimpleNamespace:
    """The VllmConfig attributes the plugin reads for an offload golden record's engine
    (tests/fixtures/golden/offload/), as vLLM 0.27 to 0.32 hold them after
    `VllmConfig._post_init_kv_transfer_config`: `cache_config.kv_offloading_size` and
    `kv_offloading_backend`; a `kv_transfer_config` whose `kv_connector` the backend names
    and whose `kv_connector_extra_config` (the record's, if it gave one) gains
    `cpu_bytes_to_use` = size x 2**30 for the native backend (not for LMCache)."""
    settings = record["settings"]
    size = settings["kv_offloading_size"]
    given = settings.get("kv_transfer_config") or {}
    extra = dict(given.get("kv_connector_extra_config", {}))
    if backend == "native":
        extra["cpu_bytes_to_use"] = size * (1 << 30)
    section = types.SimpleNamespace
    return section(
        model_config=section(max_model_len=settings["max_model_len"]),
        cache_config=section(
            block_size=16,
            cache_dtype="auto",
            kv_offloading_size=size,
            kv_offloading_backend=backend,
        ),
        parallel_config=section(
            tensor_parallel_size=settings["tensor_parallel_size"], pipeline_parallel_size=1
        ),
        device_config=section(device_type=record["platform"]),
        kv_transfer_config=section(
            kv_connector="OffloadingConnector" if backend == "native" else "LMCacheMPConnector",
            kv_connector_extra_config=extra,
        ),
    )
