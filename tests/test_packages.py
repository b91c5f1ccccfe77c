"""Each package's public names: exported by its `__init__`, and imported from there.

A name a package exports is imported from the package, not from the module that defines it,
by every caller outside the package (exporter, tests, benchmarks), so a module can move
inside its package without its callers noticing.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(
    ".".join(path.parent.relative_to(ROOT).parts)
    for path in (ROOT / "exporter").rglob("__init__.py")
    if path.parent != ROOT / "exporter"
)
SOURCES = [
    path
    for folder in ("exporter", "tests", "benchmarks")
    for path in sorted((ROOT / folder).rglob("*.py"))
]


def exported(package: str) -> set[str]:
    return set(getattr(importlib.import_module(package), "__all__", ()))


@pytest.mark.parametrize("package", PACKAGES)
def test_every_exported_name_exists(package: str) -> None:
    module = importlib.import_module(package)
    assert [name for name in exported(package) if not hasattr(module, name)] == []


def test_callers_import_exported_names_from_their_package() -> None:
    exports = {package: exported(package) for package in PACKAGES}
    found = []
    for path in SOURCES:
        where = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or node.module is None:
                continue
            package = node.module.rpartition(".")[0]
            if package not in exports or where.startswith(package + "."):
                continue
            found += [
                f"{where}: {node.module}.{alias.name}"
                for alias in node.names
                if alias.name in exports[package]
            ]
    assert found == []
