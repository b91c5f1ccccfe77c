"""Developer tools beside the package: live vLLM environments, stand-ins, probes (not shipped)."""

from pathlib import Path

# Recorded data the stand-ins replay lives with the tests' fixtures (data, not code).
GOLDEN = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "golden"
