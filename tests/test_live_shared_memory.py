"""The live harness removes the shared memory a stopped vLLM left behind, and only that."""

from __future__ import annotations

import mmap
from pathlib import Path

from tools.live.server import remove_orphaned_segments, shared_memory_segments


def _segment(directory: Path, name: str) -> Path:
    path = directory / name
    path.write_bytes(b"\0" * mmap.PAGESIZE)
    return path


def test_only_unmapped_segments_made_since_the_start_are_removed(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    _segment(shm, "psm_before")
    _segment(shm, "not_pythons")
    before = shared_memory_segments(shm)
    assert before == {"psm_before"}
    orphan = _segment(shm, "psm_orphan")
    mapped = _segment(shm, "psm_mapped")
    # This process maps one: its path appears in /proc/<pid>/maps.
    with mapped.open("r+b") as handle, mmap.mmap(handle.fileno(), mmap.PAGESIZE):
        assert remove_orphaned_segments(before, shm) == []  # made a moment ago: not yet
        assert remove_orphaned_segments(before, shm, young_s=0.0) == ["psm_orphan"]
        assert not orphan.exists()
        assert mapped.exists()
    assert remove_orphaned_segments(before, shm, young_s=0.0) == ["psm_mapped"]
    assert sorted(path.name for path in shm.iterdir()) == ["not_pythons", "psm_before"]
