"""Shared test helpers: where the fixtures are and how to read them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "golden"
GOLDEN_CASES = GOLDEN / "vllm-0.33-capacity.jsonl"


def load_golden_cases() -> list[dict[str, Any]]:
    with GOLDEN_CASES.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
