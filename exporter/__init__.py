"""kvcap: a Prometheus exporter for group-aware vLLM KV cache capacity, per engine."""

# The package's version, written here rather than read through importlib.metadata: that
# import alone costs a `capacity` run more than its arithmetic. pyproject.toml holds the
# same string; tests/deploy/test_helm.py fails when the two differ.
__version__ = "0.1.0"

__all__ = ["__version__"]
