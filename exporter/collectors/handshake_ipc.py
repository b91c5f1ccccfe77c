"""The handshake's ipc:// socket file: a private folder, the file's mode, its removal."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from exporter.errors import ConfigError


def prepare_ipc_directory(endpoint: str) -> None:
    """An ipc:// path's directory is created private (0700) when it does not exist; one that
    exists must be this user's and writable by no one else, or whoever can write there
    could replace the socket and read the ready messages, or push engines of their own.
    A mount point (a volume) is accepted as it is."""
    if not endpoint.startswith("ipc://"):
        return
    path = Path(endpoint.removeprefix("ipc://"))
    try:
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700, parents=True)
        _check_private(path.parent)
        if path.is_socket():
            os.unlink(path)  # a stale socket file from a previous run
    except OSError as error:  # read-only, or a file where a directory should be
        raise ConfigError(f"--handshake.listen {endpoint}: {error}") from None


def _check_private(folder: Path) -> None:
    info = folder.lstat()
    if stat.S_ISLNK(info.st_mode):
        raise ConfigError(f"--handshake.listen: {folder} is a symbolic link; use a real folder")
    if os.path.ismount(folder):
        # A volume mounted there (a Kubernetes emptyDir: root's, mode 0777) was given to
        # the pod's containers by whoever set the pod up; no other user can see it.
        return
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"--handshake.listen: {folder} belongs to uid {info.st_uid}, not to this user "
            f"(uid {os.geteuid()}); remove it or use a folder of this user's"
        )
    if info.st_mode & 0o022:
        raise ConfigError(
            f"--handshake.listen: {folder} is writable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}); chmod go-w it or use another folder"
        )


def set_ipc_file_mode(endpoint: str, mode: int) -> None:
    if endpoint.startswith("ipc://"):
        os.chmod(endpoint.removeprefix("ipc://"), mode)


def remove_ipc_file(endpoint: str) -> None:
    """The socket file goes with the socket, so no plugin pushes into a path nobody reads."""
    if not endpoint.startswith("ipc://"):
        return
    path = Path(endpoint.removeprefix("ipc://"))
    with contextlib.suppress(OSError):  # gone already, or the folder went with it
        if path.is_socket():
            path.unlink()
