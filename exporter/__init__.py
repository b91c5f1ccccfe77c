"""kvcap: a Prometheus exporter for group-aware vLLM KV cache capacity, per engine."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("kvcap-exporter")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
