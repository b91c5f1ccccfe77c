#!/usr/bin/env python3
"""Prints the values table of helm/kvcap-exporter/README.md from values.yaml and its schema.

    python3 scripts/chart-values-table.py            # the table, as Markdown
    python3 scripts/chart-values-table.py --write    # replaces it in the chart's README

One row per value the schema describes as a leaf (an object without `properties` is a
Kubernetes pass-through or a label map, and each alert of prometheusRule.alerts is one
row; a key the schema allows but values.yaml does not set has none): its path, its default
from values.yaml, and the comment written above it there.
tests/deploy/test_chart_readme.py checks that the README holds exactly this table.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "helm" / "kvcap-exporter"
START, END = "<!-- values-table:start -->", "<!-- values-table:end -->"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w.-]*):(?: |$)")


def comments(values_text: str) -> dict[str, str]:
    """Dotted path -> the comment lines right above that key in values.yaml, joined."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in values_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = KEY.match(line)
        if not match or stripped.startswith("-"):
            pending = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        path = ".".join(key for _, key in stack)
        if pending:
            found[path] = " ".join(pending)
        pending = []
    return found


SECTION = object()  # an object's own row: its comment, no default


def leaves(schema: dict[str, Any], values: Any, path: str = "") -> list[tuple[str, Any]]:
    if path == "prometheusRule.alerts":
        return [(path, SECTION)] + [(f"{path}.{name}", values[name]) for name in values]
    if "properties" not in schema:
        return [(path, values)]
    rows: list[tuple[str, Any]] = [(path, SECTION)] if path else []
    for name, child in schema["properties"].items():
        if name not in values:  # optional in the schema, with no default
            continue
        rows.extend(leaves(child, values[name], f"{path}.{name}" if path else name))
    return rows


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def table() -> str:
    values_text = (CHART / "values.yaml").read_text(encoding="utf-8")
    values = yaml.safe_load(values_text)
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    notes = comments(values_text)
    lines = ["| value | default | what |", "|---|---|---|"]
    for path, default in leaves(schema, values):
        if default is SECTION:
            if path in notes:
                lines.append(f"| `{path}` | | {cell(notes[path])} |")
            continue
        text = json.dumps(default, separators=(", ", ": "))
        lines.append(f"| `{path}` | `{cell(text)}` | {cell(notes.get(path, ''))} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    generated = table()
    if argv[1:] == ["--write"]:
        readme = CHART / "README.md"
        text = readme.read_text(encoding="utf-8")
        before, _, rest = text.partition(START + "\n")
        _, _, after = rest.partition(END)
        readme.write_text(f"{before}{START}\n{generated}{END}{after}", encoding="utf-8")
    else:
        sys.stdout.write(generated)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
