"""Sources: each turns one outside interface into engine reports; they register themselves."""

from exporter.sources import handshake, nvml, vllm_http  # noqa: F401 (importing registers them)
from exporter.sources.registry import SOURCES, Source, SourceSpec, register_source

__all__ = ["SOURCES", "Source", "SourceSpec", "register_source"]
