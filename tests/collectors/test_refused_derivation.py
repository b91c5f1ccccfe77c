"""An engine whose config the release refuses on its platform: its reported figures, no plan."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from exporter.collectors import ServerPoller, VllmHttpSettings, fetch
from exporter.collectors.parsing import parse_vllm_serve_args
from exporter.state import StateStore
from tests.collectors.recorded_vllm import Playback, serve
from tests.support.release_records import release_record

TINY_ID = "deepseek-v2|mml-4096|mnbt-default|mem-1GiB"
METRICS = (
    b'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",'
    b'num_gpu_blocks="4000"} 1.0\n'
)


def test_an_mla_model_cuda_refuses_is_not_given_a_derived_plan(tmp_path: Path) -> None:
    """The tiny DeepSeek-V2 (32/64/32 head dims) on CUDA 0.32.0: vLLM has no MLA prefill
    backend for it, so kvcap derives nothing and says why in the release's words."""
    record = release_record("vllm-0.32.0-cuda.jsonl", TINY_ID)
    (tmp_path / "config.json").write_text(json.dumps(record["hf_config"]))
    store = StateStore()
    playback = Playback(metrics=METRICS, documents={"/version": {"version": "0.32.0"}})
    with serve(playback) as url:
        settings = VllmHttpSettings(
            urls=(url,),
            timeout_s=1.0,
            serve_args=parse_vllm_serve_args("/models/dsv2 --max-model-len 4096"),
            model_config=tmp_path / "config.json",
            platform="cuda",
        )
        ServerPoller(url, settings, fetch, store, threading.Event()).poll_once()
    view = store.snapshot().engines[0]
    assert view.capacity.num_gpu_blocks == 4000  # what vLLM reports is still exported
    assert view.derived_kv_cache_size_tokens is None
    assert view.derivation_error == record["error"]["message"]
