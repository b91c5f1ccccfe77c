"""BasicAuth: right and wrong credentials, no user enumeration by timing, a cache of successes."""

from __future__ import annotations

import base64
import statistics
import threading
import time
from collections.abc import Callable

import bcrypt
import pytest

from exporter.errors import ConfigError
from exporter.web import BasicAuth, FairSlots
from tests.web.conftest import ALICE_HASH, ALICE_PASSWORD


def basic(user: str | bytes, password: str | bytes) -> str:
    raw = (user.encode() if isinstance(user, str) else user) + b":"
    raw += password.encode() if isinstance(password, str) else password
    return "Basic " + base64.b64encode(raw).decode()


@pytest.fixture
def bcrypt_calls(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Counts bcrypt checks; each entry is the hash checked against."""
    calls: list[bytes] = []
    real: Callable[[bytes, bytes], bool] = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    return calls


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        (basic("alice", ALICE_PASSWORD), True),
        (basic("alice", ALICE_PASSWORD).replace("Basic", "basic"), True),
        (basic("alice", "wrong"), False),
        (basic("alice", ""), False),
        (basic("mallory", ALICE_PASSWORD), False),
        (basic("", ALICE_PASSWORD), False),
        (basic("Alice", ALICE_PASSWORD), False),
        (basic("alice", ALICE_PASSWORD + "x" * 80), False),
        (None, False),
        ("", False),
        ("Basic", False),
        ("Basic !!!not-base64!!!", False),
        ("Basic " + base64.b64encode(b"alice").decode(), False),
        ("Basic ünïcode", False),
        ("Bearer " + base64.b64encode(f"alice:{ALICE_PASSWORD}".encode()).decode(), False),
    ],
)
def test_check(header: str | None, allowed: bool) -> None:
    auth = BasicAuth({"alice": ALICE_HASH, "bob": ALICE_HASH})
    assert auth.check(header) is allowed


@pytest.mark.parametrize("variant", ["2a", "2b", "2y"])
def test_accepts_every_bcrypt_variant_as_bytes_or_text(variant: str) -> None:
    hashed = f"${variant}${ALICE_HASH[4:]}"
    assert BasicAuth({"alice": hashed}).check(basic("alice", ALICE_PASSWORD))
    assert BasicAuth({"alice": hashed.encode()}).check(basic("alice", ALICE_PASSWORD))


def test_non_ascii_user_name() -> None:
    auth = BasicAuth({"zoë": ALICE_HASH})
    assert auth.check(basic("zoë", ALICE_PASSWORD))


@pytest.mark.parametrize("hashed", ["hunter2", b"$2b$04$tooshort", "$1$abc$def"])
def test_rejects_hashes_that_are_not_bcrypt(hashed: str | bytes) -> None:
    with pytest.raises(ConfigError, match=r"basic_auth_users\.alice: must be a bcrypt hash"):
        BasicAuth({"alice": hashed})


def test_unknown_user_pays_one_bcrypt_check_like_a_wrong_password(
    bcrypt_calls: list[bytes],
) -> None:
    auth = BasicAuth({"alice": ALICE_HASH})
    auth.check(basic("alice", "wrong"))
    auth.check(basic("mallory", "wrong"))
    assert len(bcrypt_calls) == 2
    wrong_password, unknown_user = bcrypt_calls
    assert wrong_password == ALICE_HASH.encode()
    # The dummy hash has the cost of the real one, so both checks take as long.
    assert unknown_user != wrong_password
    assert unknown_user[:7] == b"$2b$04$"


def test_successes_are_cached_and_failures_are_not(bcrypt_calls: list[bytes]) -> None:
    auth = BasicAuth({"alice": ALICE_HASH})
    for _ in range(3):
        assert auth.check(basic("alice", ALICE_PASSWORD))
    assert len(bcrypt_calls) == 1
    for _ in range(3):
        assert not auth.check(basic("alice", "wrong"))
        assert not auth.check(basic("mallory", ALICE_PASSWORD))
    assert len(bcrypt_calls) == 7


def test_unknown_user_takes_as_long_as_a_wrong_password() -> None:
    # Cost 6 (a few ms per check) makes bcrypt dominate the measurement. CPU time of this
    # thread, not wall time, and medians of interleaved samples keep a busy machine's
    # scheduling out of the comparison: the claim is that both cases do the same work.
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=6))
    auth = BasicAuth({"alice": hashed, "bob": hashed})
    wrong_password, unknown_user = basic("alice", "wrong"), basic("mallory", "wrong")
    wrong_password_s: list[float] = []
    unknown_user_s: list[float] = []
    for _ in range(15):
        for header, samples in ((wrong_password, wrong_password_s), (unknown_user, unknown_user_s)):
            start = time.thread_time()
            assert not auth.check(header)
            samples.append(time.thread_time() - start)
    ratio = statistics.median(unknown_user_s) / statistics.median(wrong_password_s)
    assert 0.5 < ratio < 2.0, (wrong_password_s, unknown_user_s)


def test_dummy_hash_follows_the_highest_configured_cost(bcrypt_calls: list[bytes]) -> None:
    cheap = bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4))
    dearer = bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=5))
    auth = BasicAuth({"alice": cheap, "bob": dearer})
    auth.check(basic("mallory", "x"))
    assert bcrypt_calls[-1][:7] == b"$2b$05$"


def test_bcrypt_slots_go_round_robin_by_client_address() -> None:
    slots = FairSlots(1)
    assert slots.acquire("holder", 5)
    served: list[str] = []

    def wait_for_a_slot(peer: str) -> None:
        if slots.acquire(peer, 5):
            served.append(peer)
            slots.release()

    def waiting(peer: str) -> int:
        with slots._condition:
            return len(slots._waiting.get(peer, ()))

    threads = []
    for peer, count in (("flood", 4), ("prometheus", 1)):
        for _ in range(count):
            thread = threading.Thread(target=wait_for_a_slot, args=(peer,))
            thread.start()
            threads.append(thread)
            while waiting(peer) < (len(threads) if peer == "flood" else 1):
                time.sleep(0.001)  # each waiter queued before the next one starts
    # A fifth waiter from the flooding address is refused at once, without a slot.
    assert not slots.acquire("flood", 5)
    slots.release()
    for thread in threads:
        thread.join(5)
    assert served == ["flood", "prometheus", "flood", "flood", "flood"]
