"""The chart README's values table is the one scripts/chart-values-table.py generates from
values.yaml and its schema, and it names every value and default of values.yaml."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import yaml

from tests.deploy.conftest import CHART, ROOT

SCRIPT = ROOT / "scripts" / "chart-values-table.py"
README = CHART / "README.md"
ROW = re.compile(r"^\| `(?P<path>[^`]+)` \| (?:`(?P<default>.*)`)? \| ")


def generated() -> str:
    result = subprocess.run(
        [sys.executable, SCRIPT], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout


def readme_table() -> str:
    text = README.read_text(encoding="utf-8")
    _, _, rest = text.partition("<!-- values-table:start -->\n")
    table, found, _ = rest.partition("<!-- values-table:end -->")
    assert found, "the README lost its values-table markers"
    return table


def test_the_readme_table_is_up_to_date() -> None:
    assert readme_table() == generated(), "run scripts/chart-values-table.py --write"


def _value(values: Any, path: str) -> Any:
    for key in path.split("."):
        values = values[key]
    return values


def test_every_value_and_its_default_is_in_the_table() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    rows = {
        m["path"]: m["default"] for line in readme_table().splitlines() if (m := ROW.match(line))
    }
    defaults = {path: d for path, d in rows.items() if d is not None}
    for path, default in defaults.items():
        assert json.loads(default.replace("\\|", "|")) == _value(values, path), path

    def covered(path: str) -> bool:
        return path in defaults or any(path.startswith(f"{d}.") for d in defaults)

    def leaves(node: Any, path: str = "") -> list[str]:
        if isinstance(node, dict) and node and not covered(path):
            return [p for k, v in node.items() for p in leaves(v, f"{path}.{k}" if path else k)]
        return [path]

    missing = [p for p in leaves(values) if not covered(p)]
    assert missing == []
