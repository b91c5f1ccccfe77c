"""The one exception hierarchy of kvcap.

    KvcapError
    ├── CollectorError               a collector's read failed; `reason` is the
    │   │                            kvcap_collector_errors_total reason label
    │   ├── FetchError               the HTTP fetch failed (collectors/http_fetch.py)
    │   └── MalformedInput           outside input breaks its format
    │       ├── MalformedExposition  a line of a vLLM family kvcap reads
    │       │                        (collectors/parsing/exposition.py)
    │       └── NotJson              JSON kvcap cannot accept (json_documents.py)
    ├── ConfigError                  bad settings, files or config.json content
    │   ├── FileRefused              a file past its bounds, `reason` the counter label
    │   │                            (bounded_files.py)
    │   └── UsageError               a flag or its environment twin is malformed (exit 2)
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


class CollectorError(KvcapError):
    """A collector's read failed; `reason` is the kvcap_collector_errors_total label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class MalformedInput(CollectorError, ValueError):
    """Input from outside (a body, a document, a frame) that breaks its format."""


class ConfigError(KvcapError):
    """A flag, setting or config.json field is missing or invalid."""


class UsageError(ConfigError):
    """The command line (or a KVCAP_* twin) cannot be used as given: exit status 2."""


class CapacityError(KvcapError):
    """The capacity model cannot produce a number for this input."""


class UnsupportedArchitecture(CapacityError):
    """The model family is unknown and the config lacks the generic fields."""


class UnsupportedConfiguration(CapacityError):
    """vLLM rejects this combination of model and settings at config time."""

    vllm_error_type = "ValueError"

    def __init__(self, message: str, *, vllm_error_type: str | None = None) -> None:
        super().__init__(message)
        if vllm_error_type is not None:  # the class vLLM raises, where not a ValueError
            self.vllm_error_type = vllm_error_type


class DoesNotFit(CapacityError):
    """vLLM's startup check fails: the KV cache cannot hold one full-length request.

    The message is vLLM's own text; `summary` says the same in plain words.
    """

    vllm_error_type = "ValueError"

    def __init__(
        self,
        message: str,
        *,
        max_model_len: int | None = None,
        needed_bytes: int | None = None,
        available_bytes: int | None = None,
        estimated_max_model_len: int | None = None,
    ) -> None:
        super().__init__(message)
        self.max_model_len = max_model_len
        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.estimated_max_model_len = estimated_max_model_len

    @property
    def summary(self) -> str:
        """`available_bytes` is what vLLM's check compares: the KV cache less its null block,
        named so, since printed beside the KV cache it can differ in the last digit."""
        if self.needed_bytes is None or self.available_bytes is None:
            return "vLLM would refuse to start: the KV cache cannot hold one request"
        text = (
            f"vLLM would refuse to start: one request of {self.max_model_len} tokens needs "
            f"{self.needed_bytes / 2**30:.2f} GiB of KV cache per worker, but only "
            f"{max(self.available_bytes, 0) / 2**30:.2f} GiB is usable (the KV cache less the "
            "block vLLM holds back)"
        )
        if self.estimated_max_model_len:
            text += f"; the longest max_model_len that fits is {self.estimated_max_model_len}"
        return text
