"""HTTP basic auth against bcrypt hashes, checked the way exporter-toolkit checks them."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Final

import bcrypt

from exporter.errors import ConfigError
from exporter.web.config import BCRYPT_HASH

# bcrypt reads at most 72 bytes and bcrypt>=5 refuses longer passwords outright; kvcap
# rejects them rather than let two different passwords match one hash.
_MAX_PASSWORD_BYTES: Final = 72
_DEFAULT_COST: Final = 10
# Only successes are cached, so the cache grows with real credentials, not with attempts;
# the bound only matters for a client that cycles through passwords longer than bcrypt reads.
_MAX_CACHED: Final = 1024
# bcrypt checks that run at once (the chart gives the sidecar about one core), how many may
# wait per client address, and for how long, so a flood of bad passwords is answered
# quickly and in turns with other clients instead of queueing up behind one lock.
BCRYPT_SLOTS: Final = 2
_MAX_WAITING_PER_PEER: Final = 4
_MAX_WAIT_S: Final = 2.0


class BasicAuth:
    """Checks `Authorization: Basic ...` headers against bcrypt hashes per user name.

    An unknown user costs one bcrypt check against a dummy hash of the users' cost, like a
    wrong password does, so response times do not tell which user names exist. Successful
    checks are remembered by a SHA-256 of user, password and hash, so a scraper that sends
    the same credentials every 15 s pays bcrypt once; failures always pay it. bcrypt runs
    in BCRYPT_SLOTS slots handed out in turns by client address (`peer`), so a flood from
    one address delays another address's first login by at most a few bcrypt checks; a
    check that finds its address's queue full, or waits past its bound, fails at once.
    """

    __slots__ = ("_checks", "_checks_lock", "_dummy_hash", "_slots", "_users", "_verified")

    def __init__(self, users: Mapping[str, bytes | str]) -> None:
        self._users = tuple(
            (name.encode("utf-8"), _checked_hash(name, hashed)) for name, hashed in users.items()
        )
        # With mixed costs the highest one is mimicked; every configured user then costs at
        # most as much as an unknown one.
        cost = max((int(hashed[4:6]) for _, hashed in self._users), default=_DEFAULT_COST)
        self._dummy_hash = bcrypt.hashpw(b"kvcap: no such user", bcrypt.gensalt(rounds=cost))
        self._verified: set[bytes] = set()
        self._slots = FairSlots(BCRYPT_SLOTS)
        self._checks = 0
        self._checks_lock = threading.Lock()

    @property
    def bcrypt_checks(self) -> int:
        """bcrypt checks run so far (the dummy hash made at start not counted)."""
        return self._checks

    def check(self, authorization_header: str | None, peer: str = "") -> bool:
        """True when the header carries a configured user name and its password."""
        return self.verdict(authorization_header, peer) == "ok"

    def verdict(self, authorization_header: str | None, peer: str = "") -> str:
        """ "ok", "unauthorized", or "busy" when no bcrypt slot was free for `peer` in time."""
        credentials = _parse_basic(authorization_header)
        if credentials is None:
            return "unauthorized"
        user, password = credentials
        known = False
        stored = self._dummy_hash
        # Every name is compared, in constant time each, so the position of a match and the
        # length of a common prefix do not show in the timing.
        for name, hashed in self._users:
            if hmac.compare_digest(name, user):
                known, stored = True, hashed
        key = _cache_key(user, password, stored)
        if known and key in self._verified:
            return "ok"
        if not self._slots.acquire(peer, _MAX_WAIT_S):
            return "busy"
        try:
            matches = self._bcrypt_matches(password, stored)
        finally:
            self._slots.release()
        if not (known and matches):
            return "unauthorized"
        if len(self._verified) >= _MAX_CACHED:
            self._verified.clear()
        self._verified.add(key)
        return "ok"

    def _bcrypt_matches(self, password: bytes, stored: bytes) -> bool:
        with self._checks_lock:
            self._checks += 1
        too_long = len(password) > _MAX_PASSWORD_BYTES
        # A too-long password still pays for one check, so it is no faster to refuse.
        matches = bcrypt.checkpw(password[:_MAX_PASSWORD_BYTES], stored)
        return matches and not too_long


class FairSlots:
    """`slots` permits, handed out in turns by peer: a peer's next waiter goes to the back.

    At most _MAX_WAITING_PER_PEER wait per peer; acquire() is False at once beyond that,
    and after `timeout_s` of waiting.
    """

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._condition = threading.Condition()
        self._waiting: dict[str, deque[object]] = {}
        self._turns: deque[str] = deque()  # peers with waiters, the next one to serve first

    def acquire(self, peer: str, timeout_s: float) -> bool:
        ticket = object()
        deadline = time.monotonic() + timeout_s
        with self._condition:
            queue = self._waiting.get(peer)
            if queue is None:
                queue = self._waiting[peer] = deque()
                self._turns.append(peer)
            if len(queue) >= _MAX_WAITING_PER_PEER:
                return False
            queue.append(ticket)
            while not (self._free > 0 and self._turns[0] == peer and queue[0] is ticket):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._leave(peer, queue, ticket, served=False)
                    return False
                self._condition.wait(remaining)
            self._free -= 1
            self._leave(peer, queue, ticket, served=True)
            return True

    def release(self) -> None:
        with self._condition:
            self._free += 1
            self._condition.notify_all()

    def _leave(self, peer: str, queue: deque[object], ticket: object, *, served: bool) -> None:
        queue.remove(ticket)
        if not queue:
            self._turns.remove(peer)
            del self._waiting[peer]
        elif served:  # its next waiter waits for the other peers' turns
            self._turns.remove(peer)
            self._turns.append(peer)
        self._condition.notify_all()


def _checked_hash(name: str, hashed: bytes | str) -> bytes:
    text = hashed.decode("ascii", "replace") if isinstance(hashed, bytes) else hashed
    if not BCRYPT_HASH.fullmatch(text):
        raise ConfigError(f"web config basic_auth_users.{name}: must be a bcrypt hash")
    return text.encode("ascii")


def _parse_basic(header: str | None) -> tuple[bytes, bytes] | None:
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True)
    except (binascii.Error, ValueError):  # ValueError: non-ASCII characters in the token
        return None
    user, colon, password = decoded.partition(b":")
    return (user, password) if colon else None


def _cache_key(user: bytes, password: bytes, stored: bytes) -> bytes:
    # Length prefixes keep ("a:b", "c") and ("a", "b:c") apart.
    digest = hashlib.sha256()
    for part in (user, stored, password):
        digest.update(len(part).to_bytes(4, "big"))
        digest.update(part)
    return digest.digest()
