"""The package's import graph, read from the source (ast): no cycles, and the scrape path
(state, exposition, web) reaches no collector.

Every import counts, those under `if TYPE_CHECKING:` and inside functions too: a cycle
hidden from the interpreter is still two modules that cannot be read one without the other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "exporter"
SCRAPE_PATH = ("exporter.state", "exporter.exposition", "exporter.web")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(name: str, path: Path) -> Iterator[str]:
    """The package's modules that `name` imports (a package stands for its __init__)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # `from package import module` imports the module, `from module import name`
            # the module (the parents' __init__ run first: not an edge, as elsewhere).
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            found = target
            while found and found not in MODULES:
                found = found.rpartition(".")[0]
            if found and found != name:
                yield found


GRAPH = {name: sorted(set(imported(name, path))) for name, path in MODULES.items()}


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, []):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        for nxt in GRAPH.get(node, []):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_reader_finds_the_imports_it_is_meant_to() -> None:
    assert "exporter.state.snapshot" in GRAPH["exporter.state"]
    assert "exporter.capacity" in GRAPH["exporter.state.records"]
    assert "exporter.collectors.registry" in GRAPH["exporter.collectors.kv_events"]
    # A cycle made up for the check is found.
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def test_the_package_has_no_import_cycles() -> None:
    assert cycles(GRAPH) == []


def test_the_scrape_path_reaches_no_collector() -> None:
    for name in MODULES:
        if not name.startswith(SCRAPE_PATH):
            continue
        reached = sorted(m for m in reachable(name) if m.startswith("exporter.collectors"))
        assert reached == [], f"{name} reaches {reached}"
