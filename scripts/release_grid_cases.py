"""The 0.33 golden settings grid as cases for scripts/release_golden.py, for every release.

Not run by CI. Each record of `tests/fixtures/golden/vllm-0.33-capacity.jsonl` (13 models x
TP/PP x KV dtype x block size x `--max-model-len` incl. `-1` x MNBT x KV memory x
`--num-gpu-blocks-override`) becomes one case with the same id, model, config and
settings, so each release plans every combination the 0.33 golden file has (its
refusals included: the release's record then holds the release's own error):

    .venv/bin/python scripts/release_grid_cases.py \
        --golden tests/fixtures/golden/vllm-0.33-capacity.jsonl \
        --out scripts/release_cases_grid.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

# The golden settings that are `vllm serve` flags or the KV memory; `dtype` is always
# "auto" there (every config is bfloat16) and release_golden.py passes bfloat16 itself.
SETTING_KEYS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "kv_cache_dtype",
    "block_size",
    "max_model_len",
    "max_num_batched_tokens",
    "num_gpu_blocks_override",
    "available_kv_bytes_per_worker",
)


def case_of(record: dict[str, Any]) -> dict[str, Any]:
    """One golden record as a release_golden.py case (`null` settings: vLLM's default)."""
    settings = {key: record["settings"][key] for key in SETTING_KEYS}
    return {
        "id": record["id"],
        "model": record["model"],
        "hf_config": record["hf_config"],
        "settings": settings,
    }


def grid_cases(lines: list[str]) -> list[dict[str, Any]]:
    """Every record of the golden file, in its order, as a case; ids stay unique."""
    cases = [case_of(json.loads(line)) for line in lines if line.strip()]
    ids = [case["id"] for case in cases]
    if len(set(ids)) != len(ids):
        raise ValueError("the golden file repeats an id")
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--golden", type=Path, required=True, help="the 0.33 golden JSONL")
    parser.add_argument("--out", type=Path, required=True, help="the cases JSON to write")
    args = parser.parse_args()
    cases = grid_cases(args.golden.read_text(encoding="utf-8").splitlines())
    args.out.write_text(json.dumps(cases, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(cases)} cases -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
