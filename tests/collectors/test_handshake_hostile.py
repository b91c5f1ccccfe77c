"""The handshake socket under hostile peers and hostile folders: real ZMQ sockets, a second user.

The second user is `nobody`, run through setpriv (the tests run as root, as CI does); what
it runs is the system python with the standard library only.
"""

from __future__ import annotations

import math
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from exporter.collectors import HandshakeCollector, HandshakeSettings
from exporter.collectors.registry import DEFAULT_MAX_ENGINES
from exporter.errors import ConfigError
from exporter.handshake_wire import (
    READY_V2_TOPIC,
    ReadyExtras,
    bye_message,
    encode,
    ready_message,
    ready_v2_message,
)
from exporter.state import StateStore
from tests import support
from tests.collectors import test_handshake
from tests.collectors.test_handshake import private_endpoint
from tests.support import cli_command
from tests.tools import missing
from tools.handshake_data import HANDSHAKE

NOBODY = 65534
TOKEN = "a-process-secret-of-32-chars-xyz"
RECORDING = HANDSHAKE / "llama-3.1-8b-dp2-tp1.engine0.msgpack"


def ready_bytes(rank: int, **changes: Any) -> bytes:
    fields = msgspec.msgpack.decode(RECORDING.read_bytes())
    fields.update({"data_parallel_rank": rank, "instance_id": f"i{rank}", **changes})
    return msgspec.msgpack.encode(fields)


def as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        missing("setpriv (util-linux) is not installed")
    return subprocess.run(
        [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder under /tmp that `nobody` can enter (tmp_path is root's own, 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="kvcap-hostile-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


class Listener(test_handshake.Listener):
    """test_handshake's Listener, with what the hostile tests read off its store."""

    def engines(self) -> list[str]:
        return [view.engine for view in self.store.snapshot().engines]

    def errors(self, reason: str) -> int:
        return self.store.snapshot().errors.get(("handshake", reason), 0)

    def until(self, condition: Any, timeout_s: float = 10.0) -> None:
        support.wait_for(
            condition,
            timeout_s,
            "the condition",
            lambda: f"errors {self.store.snapshot().errors}, engines {self.engines()}",
        )


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[Listener]:
    with Listener(private_endpoint(tmp_path)) as started:
        yield started


def in_sticky_folder(shared_tmp: Path) -> Path:
    """A world-writable folder with the sticky bit, as /tmp is, for another user's folder."""
    shared = shared_tmp / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    return shared


@pytest.mark.process
def test_a_folder_of_another_user_is_refused_in_one_line(shared_tmp: Path) -> None:
    folder = in_sticky_folder(shared_tmp) / "kvcap"
    made = as_nobody("/bin/mkdir", "-m", "0700", str(folder))
    assert made.returncode == 0, made.stderr
    assert folder.stat().st_uid == NOBODY
    collector = HandshakeCollector(HandshakeSettings(endpoint=f"ipc://{folder}/handshake.sock"))
    with pytest.raises(ConfigError, match="belongs to uid 65534") as refused:
        collector.start(StateStore())
    collector.stop(1.0)
    assert "\n" not in str(refused.value)


@pytest.mark.process
def test_the_daemon_refuses_a_folder_of_another_user_in_one_line(shared_tmp: Path) -> None:
    folder = in_sticky_folder(shared_tmp) / "kvcap"
    assert as_nobody("/bin/mkdir", "-m", "0777", str(folder)).returncode == 0
    run = subprocess.run(
        cli_command("serve", "--web.listen-address=127.0.0.1:0",
            "--no-collector.nvml", "--no-collector.vllm_http",
            f"--handshake.listen=ipc://{folder}/handshake.sock"),
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert run.returncode == 1
    errors = [line for line in run.stderr.splitlines() if "error" in line]
    assert errors == [errors[0]]
    assert "belongs to uid 65534" in errors[0]
    assert "Traceback" not in run.stderr
    assert not (folder / "handshake.sock").exists()


def test_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    collector = HandshakeCollector(HandshakeSettings(endpoint=f"ipc://{folder}/handshake.sock"))
    with pytest.raises(ConfigError, match="writable by group or others"):
        collector.start(StateStore())
    collector.stop(1.0)


@pytest.mark.process
def test_the_socket_is_0600_whatever_the_umask_and_nobody_cannot_connect(shared_tmp: Path) -> None:
    folder = shared_tmp / "kvcap"
    folder.mkdir(mode=0o755)  # ours, not writable by others: accepted, and nobody may enter
    folder.chmod(0o755)
    path = folder / "handshake.sock"
    old = os.umask(0)
    try:
        with Listener(f"ipc://{path}") as listener:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            attempt = as_nobody(
                "/usr/bin/python3", "-c",
                "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])",
                str(path),
            )  # fmt: skip
            assert attempt.returncode != 0
            assert "PermissionError" in attempt.stderr
            assert listener.engines() == []
    finally:
        os.umask(old)
    assert not path.exists()  # removed on stop


def test_a_bye_must_carry_the_token_of_the_engines_process(listener: Listener) -> None:
    listener.send(ready_v2_message(ready_bytes(0), 5.0, bye_token=TOKEN))
    listener.until(lambda: listener.engines() == ["0"])
    # What /metrics shows (engine and instance_id) is not enough to remove the engine.
    listener.send(bye_message(0, "i0"))
    listener.send(bye_message(0, "i0", "a-guessed-token-of-32-characters"))
    listener.until(lambda: listener.errors("bye_refused") == 2)
    assert listener.engines() == ["0"]
    listener.send(bye_message(0, "i0", TOKEN))
    listener.until(lambda: listener.engines() == [])


def test_an_older_plugins_bye_without_a_token_is_still_accepted(listener: Listener) -> None:
    listener.send(ready_message(ready_bytes(0)))  # v1: no heartbeat, no token
    listener.send(ready_v2_message(ready_bytes(1), 5.0))  # v2 from before the token
    listener.until(lambda: listener.engines() == ["0", "1"])
    listener.send(bye_message(0, "i0"))
    listener.send(bye_message(1, "i1"))
    listener.until(lambda: listener.engines() == [])


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"num_gpu_blocks": -5}, "negative blocks"),
        ({"num_gpu_blocks": 2**64 - 1}, "2**64 - 1"),
        ({"kv_cache_max_concurrency": math.nan}, "NaN"),
        ({"kv_cache_max_concurrency": math.inf}, "infinity"),
        ({"max_model_len": 0}, "zero length"),
        ({"instance_id": "x" * 1000}, "a long instance id"),
        ({"vllm_version": "v" * 100_000}, "a 100 kB string"),
    ],
)
def test_values_past_what_vllm_produces_are_refused(
    listener: Listener, changes: dict[str, Any], why: str
) -> None:
    listener.send(ready_v2_message(ready_bytes(0, **changes), 5.0))
    listener.until(
        lambda: listener.errors("malformed_frame") + listener.errors("frame_too_large") == 1
    )
    assert listener.engines() == [], why


def test_long_model_names_are_refused_and_nothing_grows(listener: Listener) -> None:
    # The red team's attack: 120 ready messages with a 100 kB model_name.
    for rank in range(120):
        extras = ReadyExtras(model_name="m" * 100_000)
        listener.send(ready_v2_message(ready_bytes(rank), 5.0, extras))
        extras = ReadyExtras(model_name="m" * 1000)  # under the frame cap, over the string cap
        listener.send(ready_v2_message(ready_bytes(rank), 5.0, extras))
    listener.until(
        lambda: (
            listener.errors("frame_too_large") == 120 and listener.errors("malformed_frame") == 120
        )
    )
    assert listener.engines() == []


def test_a_message_of_150_frames_is_dropped_frame_by_frame(listener: Listener) -> None:
    frame = b"x" * 60_000  # each under the frame cap: only the count gives it away
    listener.send([READY_V2_TOPIC] + [frame] * 150)
    listener.until(lambda: listener.errors("wrong_frame_count") == 1)
    listener.send(ready_v2_message(ready_bytes(0), 5.0))
    listener.until(lambda: listener.engines() == ["0"])


def test_forged_engines_stop_at_max_engines(tmp_path: Path) -> None:
    assert DEFAULT_MAX_ENGINES == 256
    endpoint = f"ipc://{tmp_path}/kvcap/handshake.sock"
    with Listener(endpoint, max_engines=16, max_messages_per_s=10_000.0) as listener:
        for rank in range(40):
            listener.send(ready_v2_message(ready_bytes(rank), 5.0))
        listener.until(lambda: listener.errors("too_many_engines") == 24)
        assert len(listener.engines()) == 16
        # A known engine still updates; after a bye there is room again.
        listener.send(bye_message(0, "i0"))
        listener.send(ready_v2_message(ready_bytes(39), 5.0))
        listener.until(lambda: "39" in listener.engines())


def test_a_junk_flood_does_not_crowd_out_real_ready_messages(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/kvcap/handshake.sock"
    with Listener(endpoint, max_messages_per_s=20.0) as listener:
        for rank in range(8):
            for _ in range(250):
                listener.send([b"kvcap.junk.v1", b"x"])
                listener.send([READY_V2_TOPIC, b"\xc1", b"\xc1"])
            listener.send(ready_v2_message(ready_bytes(rank), 5.0))
        listener.until(lambda: len(listener.engines()) == 8)
        assert listener.errors("unknown_topic") == 2000
        assert listener.errors("malformed_frame") == 2000
        assert listener.errors("rate_limited") == 0


def test_a_well_formed_flood_is_rate_limited(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/kvcap/handshake.sock"
    with Listener(endpoint, max_messages_per_s=10.0) as listener:
        for rank in range(50):
            listener.send(ready_v2_message(ready_bytes(rank), 5.0))
        listener.until(lambda: len(listener.engines()) + listener.errors("rate_limited") == 50)
        assert len(listener.engines()) <= 11


def test_extras_lists_are_bounded(listener: Listener) -> None:
    extras = encode({"devices": ["0"] * 5000})
    listener.send([READY_V2_TOPIC, ready_bytes(0), encode({"interval_s": 5.0}), extras])
    listener.until(lambda: listener.errors("malformed_frame") == 1)
    assert listener.engines() == []


def test_the_socket_mode_can_let_a_group_in(tmp_path: Path) -> None:
    path = tmp_path / "kvcap" / "handshake.sock"
    with Listener(f"ipc://{path}", socket_mode=0o660):
        assert stat.S_IMODE(path.stat().st_mode) == 0o660
