"""Real vLLM CPU servers and kvcap sidecars: the live suite's parts, `make live-deps`, the demo."""
