"""bounded_files: only regular files, size-capped, within a deadline; YAML without aliases."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from exporter import bounded_files
from exporter.bounded_files import (
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    FileRefused,
    load_yaml,
    read_file_within,
    read_regular_file,
    read_vllm_config_within,
)
from exporter.errors import ConfigError
from exporter.model_config import load_model_config
from tests.support.fifo import refusal_of_a_fifo

# The issue's 1 KiB "billion laughs": nine levels of nine aliases, 9**9 leaves expanded.
BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{name}: &{name} [{', '.join(['*' + previous] * 9)}]\n"
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
)


def test_a_regular_file_at_its_cap_is_read_whole_and_one_byte_past_it_is_refused(
    tmp_path: Path,
) -> None:
    file = tmp_path / "f"
    file.write_bytes(b"x" * 1000)
    assert read_regular_file(file, max_bytes=1000) == b"x" * 1000
    with pytest.raises(FileRefused, match=r"larger than 999 bytes.*\(1,000 bytes\)") as refused:
        read_regular_file(file, max_bytes=999)
    assert refused.value.reason == "file_too_large"


def test_a_fifo_is_refused_at_once_without_waiting_for_a_writer(tmp_path: Path) -> None:
    error = refusal_of_a_fifo(tmp_path / "fifo", lambda f: read_regular_file(f, max_bytes=100))
    assert isinstance(error, FileRefused)
    assert str(error) == "a FIFO, not a regular file (kvcap reads only those)"
    assert error.reason == "file_not_regular"


def test_a_device_is_refused_before_anything_is_read() -> None:
    with pytest.raises(FileRefused, match="a character device") as refused:
        read_regular_file("/dev/zero", max_bytes=100)
    assert refused.value.reason == "file_not_regular"


def test_a_sparse_gigabyte_is_refused_by_its_size_not_read(tmp_path: Path) -> None:
    sparse = tmp_path / "sparse"
    with sparse.open("wb") as handle:
        handle.truncate(2**30)
    began = time.process_time()
    with pytest.raises(FileRefused, match=r"larger than 1 MiB.*1,073,741,824 bytes"):
        read_regular_file(sparse, max_bytes=2**20)
    assert time.process_time() - began < 0.5  # generous: nothing of it is read


def test_a_folder_and_a_missing_file_are_oserrors_as_open_says_them(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        read_regular_file(tmp_path, max_bytes=100)
    with pytest.raises(FileNotFoundError):
        read_regular_file(tmp_path / "missing", max_bytes=100)


def test_a_read_past_its_deadline_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_bytes(b"x" * 2**18)  # four chunks
    with pytest.raises(FileRefused, match=r"not read within -1 s \(65536 bytes read\)") as refused:
        read_regular_file(file, max_bytes=2**20, deadline_s=-1.0)
    assert refused.value.reason == "file_read_timeout"


def test_the_billion_laughs_is_refused_at_its_first_alias_in_bounded_time() -> None:
    assert len(BILLION_LAUGHS) < 1100
    began = time.process_time()
    with pytest.raises(FileRefused, match=r"YAML aliases \(\*name\) are not read") as refused:
        load_yaml(BILLION_LAUGHS)
    assert time.process_time() - began < 0.5
    assert refused.value.reason == "file_malformed"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("a: " + "[" * 10_000 + "]" * 10_000, f"nested deeper than {MAX_YAML_DEPTH}"),
        ("a: [" + ", ".join(["1"] * (MAX_YAML_NODES + 1)) + "]", "more than 10,000 YAML nodes"),
        ("a: <<: *b", "not valid YAML"),
        ("a: !!python/object:os.system x", "not valid YAML"),
        ("a: " + "9" * 5000, "a YAML integer of 5,000 characters"),  # not even int()ed
    ],
    ids=["deep", "too-many-nodes", "broken", "python-tag", "long-int"],
)
def test_hostile_yaml_shapes_are_one_clean_refusal(text: str, why: str) -> None:
    with pytest.raises(FileRefused, match=why):
        load_yaml(text)


def test_a_vllm_config_with_anchors_but_no_alias_is_read() -> None:
    text = "max_model_len: &len 8192\ncompilation_config: {level: 3}\nport: 8000\n"
    assert load_yaml(text) == {
        "max_model_len": 8192,
        "compilation_config": {"level": 3},
        "port": 8000,
    }
    assert load_yaml("") is None


@pytest.mark.parametrize("kind", ["fifo", "device", "sparse"])
def test_a_config_json_that_is_no_regular_small_file_is_a_config_error_naming_it(
    tmp_path: Path, kind: str
) -> None:
    file = tmp_path / "config.json"
    if kind == "fifo":
        os.mkfifo(file)
    elif kind == "device":
        file.symlink_to("/dev/zero")
    else:
        with file.open("wb") as handle:
            handle.truncate(500 * 2**20)
    with pytest.raises(ConfigError) as refused:
        load_model_config(tmp_path)
    assert str(refused.value).startswith(f"{file}: ")
    assert isinstance(refused.value, FileRefused)
    expected = "file_too_large" if kind == "sparse" else "file_not_regular"
    assert refused.value.reason == expected


def test_a_base_60_or_huge_yaml_integer_is_refused_before_it_is_computed() -> None:
    """PyYAML's safe loader reads `1:0:0:...` as a base-60 integer, quadratic in its
    parts: a 1 MiB scalar was minutes of CPU on the thread that reads it."""
    with pytest.raises(FileRefused, match="base 60"):
        load_yaml("max-model-len: " + ":".join(["1"] * 200_000))
    with pytest.raises(FileRefused, match="base 60"):
        load_yaml("max-model-len: " + "9" * 100)
    assert load_yaml("max-model-len: 8192\nport: 0x1F") == {"max-model-len": 8192, "port": 31}


@pytest.mark.parametrize("as_root", [True, False])
def test_a_file_within_a_folder_is_held_to_the_same_bounds(tmp_path: Path, as_root: bool) -> None:
    """read_file_within (another container's files): a FIFO and a device are refused without
    being opened, a file past the cap by its size."""
    (tmp_path / "dev").mkdir()
    fifo_refused = refusal_of_a_fifo(
        tmp_path / "dev" / "fifo",
        lambda _: read_file_within(tmp_path, "dev/fifo", as_root=as_root, max_bytes=10),
    )
    assert isinstance(fifo_refused, FileRefused)
    assert fifo_refused.reason == "file_not_regular"
    (tmp_path / "dev" / "zero").symlink_to("/dev/zero")
    # A link out of the folder: EXDEV beneath it; as root, /dev/zero inside it is the link
    # itself: a loop (ELOOP).
    with pytest.raises(OSError, match=r"cross-device link|Too many levels of symbolic links"):
        read_file_within(tmp_path, "dev/zero", as_root=as_root, max_bytes=10)
    (tmp_path / "big").write_bytes(b"x" * 11)
    with pytest.raises(FileRefused, match="larger than 10 bytes"):
        read_file_within(tmp_path, "big", as_root=as_root, max_bytes=10)
    assert read_file_within(tmp_path, "big", as_root=as_root, max_bytes=11) == b"x" * 11


def test_without_openat2_a_file_within_is_followed_plainly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels before 5.6 (or a seccomp profile without openat2) say ENOSYS or EPERM: the
    path is then followed as before, still a regular file within its cap."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "vllm.yaml").write_text("a: 1\n")

    def refused(*_: object) -> int:
        raise bounded_files._NoOpenat2

    monkeypatch.setattr(bounded_files, "_openat2", refused)
    text = read_vllm_config_within(tmp_path, "/etc/vllm.yaml", as_root=True)
    assert text == "a: 1\n"
