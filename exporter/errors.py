"""The one exception hierarchy of kvcap.

    KvcapError
    ├── ConfigError                  bad flags, settings or config.json content
    └── CapacityError                the capacity model cannot give a number
        ├── UnsupportedArchitecture  unknown model family without the generic fields
        ├── UnsupportedConfiguration vLLM itself refuses this config before planning
        └── DoesNotFit               vLLM's KV cache admission check fails

Errors that mirror a refusal of vLLM carry `vllm_error_type`, the exception class
vLLM raises in the same situation, so batch output can be compared with vLLM's.
"""

from __future__ import annotations


class KvcapError(Exception):
    """Base class of every error kvcap raises on purpose."""

    vllm_error_type: str | None = None


class ConfigError(KvcapError):
    """A flag, setting or config.json field is missing or invalid."""


class CapacityError(KvcapError):
    """The capacity model cannot produce a number for this input."""


class UnsupportedArchitecture(CapacityError):
    """The model family is unknown and the config lacks the generic fields."""


class UnsupportedConfiguration(CapacityError):
    """vLLM rejects this combination of model and settings at config time."""

    vllm_error_type = "ValueError"


class DoesNotFit(CapacityError):
    """vLLM's startup check fails: the KV cache cannot hold one full-length request."""

    vllm_error_type = "ValueError"
