"""A stand-in NVML library (C, built on demand) and the GPUs it reports."""
