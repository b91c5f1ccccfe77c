"""One container of a rendered pod, set up inside its own mount namespace, then exec'd.

Run as root by tests/live/pod.py under `unshare --mount` (and the pod's network and PID
namespaces), with one JSON argument. It builds the container's root in a tmpfs: the host's
top-level folders bound in (the parents of a mount path shadowed, their other entries bound
one by one), a fresh /proc, then each mount (volumes, image folders) bound at its path,
read-only where the spec says so and every other mount read-only where the container has
`readOnlyRootFilesystem`; then chroot, the working directory, and `setpriv` with the
rendered user, group, no-new-privileges and capabilities. Standard library only: it runs
before the container's own Python is there.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
from pathlib import Path

# Bound recursively: their submounts (/dev/shm, /dev/pts, cgroups) come with them.
RECURSIVE = {"dev", "sys"}


MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384
_libc = ctypes.CDLL(None, use_errno=True)


def mount(
    source: str, target: Path, fstype: str | None = None, flags: int = 0, data: str = ""
) -> None:
    """mount(2) itself: hundreds of bind mounts per container, no process each."""
    if (
        _libc.mount(
            source.encode(),
            str(target).encode(),
            fstype and fstype.encode(),
            flags,
            data.encode() or None,
        )
        != 0
    ):
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def read_only(target: Path) -> None:
    mount("none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def shadow(host: Path, target: Path, needed: set[Path], bound: list[Path]) -> None:
    """`target` (a folder in the tmpfs) shows `host`'s entries; a parent of a needed path is
    a tmpfs folder of its own (so a mount point can be made in it without touching the host)."""
    for entry in sorted(host.iterdir()):
        if host == Path("/") and entry.name in {"proc"}:
            continue
        inside = target / entry.name
        top_level_recursive = host == Path("/") and entry.name in RECURSIVE
        parent_of_needed = any(entry == n or entry in n.parents for n in needed)
        if parent_of_needed and entry.is_dir() and not top_level_recursive:
            inside.mkdir(mode=0o755)
            shadow(entry, inside, needed, bound)
            continue
        if entry.is_symlink():
            inside.symlink_to(os.readlink(entry))
            continue
        if entry.is_dir():
            inside.mkdir()
        elif entry.exists():
            inside.touch()
        else:
            continue
        mount(str(entry), inside, None, MS_BIND | (MS_REC if top_level_recursive else 0))
        bound.append(inside)


def main() -> None:
    spec = json.loads(sys.argv[1])
    root = Path(spec["root"])
    mount("container-root", root, "tmpfs", 0, "mode=0755")
    mounts = [(Path(m["path"]), Path(m["source"]), bool(m["read_only"])) for m in spec["mounts"]]
    needed = {path for path, _, _ in mounts} | {Path(p) for p in spec["needed"]}
    bound: list[Path] = []
    shadow(Path("/"), root, needed, bound)
    (root / "proc").mkdir()
    mount("proc", root / "proc", "proc")
    for path, source, ro in sorted(mounts, key=lambda m: len(m[0].parts)):
        inside = root / path.relative_to("/")
        inside.mkdir(parents=True, exist_ok=True)
        mount(str(source), inside, None, MS_BIND)
        if ro:
            read_only(inside)
    if spec["read_only_root"]:
        mount_points = {root / p.relative_to("/") for p, _, _ in mounts}
        for inside in bound:
            if inside not in mount_points and inside.name not in RECURSIVE:
                read_only(inside)
        mount("none", root, None, MS_REMOUNT | MS_RDONLY)
    setpriv_path = shutil.which("setpriv") or "setpriv"
    os.chroot(root)
    os.chdir(spec["working_dir"])
    setpriv = [setpriv_path, "--no-new-privs"] if spec["no_new_privs"] else [setpriv_path]
    if spec["uid"] is not None:
        setpriv += [f"--reuid={spec['uid']}", f"--regid={spec['gid']}", "--clear-groups"]
    if spec["drop_all_capabilities"]:
        setpriv += ["--bounding-set=-all", "--inh-caps=-all"]
    os.execve(setpriv_path, [*setpriv, *spec["command"]], spec["env"])


if __name__ == "__main__":
    main()
