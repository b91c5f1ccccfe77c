"""Shared test helpers: where the fixtures are and how to read them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings

# Property tests run a short budget by default; `make fuzz` selects the long one.
settings.register_profile("default", max_examples=100, deadline=None)
settings.register_profile(
    "fuzz", max_examples=20_000, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "golden"
GOLDEN_CASES = GOLDEN / "vllm-0.33-capacity.jsonl"


def load_golden_cases() -> list[dict[str, Any]]:
    with GOLDEN_CASES.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
