"""The suite's lanes and the tools' direction: tests import tools, never the other way round."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import KINDS, LANES, TESTS, lane
from tools.live import vllm_install

ROOT = TESTS.parent


def test_every_lane_entry_names_a_folder_or_file_that_exists() -> None:
    """A renamed file would otherwise fall back silently to its folder's lane."""
    for where, kind in LANES.items():
        assert kind in KINDS, where
        if where:
            assert (TESTS / where).exists(), where


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("capacity/test_golden.py", "unit"),
        ("collectors/parsing/test_exposition.py", "unit"),
        ("deploy/test_helm.py", "deploy"),
        ("integration/test_prometheus.py", "deploy"),
        ("live/test_live_capacity.py", "live"),
        ("faults/test_engine_killed.py", "process"),
        ("faults/test_gpu_lost.py", "unit"),
        ("test_cli.py", "process"),
    ],
)
def test_the_lane_of_a_file_is_its_longest_matching_entry(path: str, kind: str) -> None:
    assert lane(TESTS / path) == kind


def test_no_test_outside_the_unit_lane_is_marked_unit() -> None:
    """`-m unit` does not even import the files of the other lanes (conftest's
    pytest_ignore_collect): a unit test there would never run in `make check`."""
    others = [path for path in TESTS.rglob("test_*.py") if lane(path) != "unit"]
    assert others
    marked = [str(p.relative_to(TESTS)) for p in others if "mark.unit" in p.read_text("utf-8")]
    assert marked == []


def _imported_roots(source: Path) -> set[str]:
    tree = ast.parse(source.read_text(encoding="utf-8"))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", ["tools", "benchmarks", "scripts"])
def test_tools_benchmarks_and_scripts_import_nothing_from_tests(package: str) -> None:
    sources = sorted((ROOT / package).rglob("*.py"))
    assert sources
    offenders = [str(s.relative_to(ROOT)) for s in sources if "tests" in _imported_roots(s)]
    assert offenders == []


def test_a_missing_vllm_environment_fails_naming_make_live_deps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only `make live-deps` installs vLLM: a lookup never downloads 3.4 GB."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(vllm_install.NotInstalled, match=r"run `make live-deps`"):
        vllm_install.vllm_python("0.32.0")
    assert list(tmp_path.iterdir()) == []  # nothing was installed, not even a folder


def test_an_installed_environment_is_found_and_a_stale_one_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    venv = vllm_install.venv_dir("0.32.0")
    venv.mkdir(parents=True)
    stamp = venv / ".kvcap-recipe"
    stamp.write_text("an older recipe")
    with pytest.raises(vllm_install.NotInstalled, match="recipe"):
        vllm_install.vllm_python("0.32.0")
    stamp.write_text(vllm_install._stamp("0.32.0"))
    assert vllm_install.vllm_python("0.32.0") == venv / "bin" / "python"
