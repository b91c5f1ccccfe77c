"""HTTP basic auth against bcrypt hashes, checked the way exporter-toolkit checks them."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import threading
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


class BasicAuth:
    """Checks `Authorization: Basic ...` headers against bcrypt hashes per user name.

    An unknown user costs one bcrypt check against a dummy hash of the users' cost, like a
    wrong password does, so response times do not tell which user names exist. Successful
    checks are remembered by a SHA-256 of user, password and hash, so a scraper that sends
    the same credentials every 15 s pays bcrypt once; failures always pay it. bcrypt runs
    under a lock, so a flood of bad attempts takes one core, not all of them.
    """

    __slots__ = ("_bcrypt_lock", "_dummy_hash", "_users", "_verified")

    def __init__(self, users: Mapping[str, bytes | str]) -> None:
        self._users = tuple(
            (name.encode("utf-8"), _checked_hash(name, hashed)) for name, hashed in users.items()
        )
        # With mixed costs the highest one is mimicked; every configured user then costs at
        # most as much as an unknown one.
        cost = max((int(hashed[4:6]) for _, hashed in self._users), default=_DEFAULT_COST)
        self._dummy_hash = bcrypt.hashpw(b"kvcap: no such user", bcrypt.gensalt(rounds=cost))
        self._verified: set[bytes] = set()
        self._bcrypt_lock = threading.Lock()

    def check(self, authorization_header: str | None) -> bool:
        """True when the header carries a configured user name and its password."""
        credentials = _parse_basic(authorization_header)
        if credentials is None:
            return False
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
            return True
        matches = self._bcrypt_matches(password, stored)
        if not (known and matches):
            return False
        if len(self._verified) >= _MAX_CACHED:
            self._verified.clear()
        self._verified.add(key)
        return True

    def _bcrypt_matches(self, password: bytes, stored: bytes) -> bool:
        too_long = len(password) > _MAX_PASSWORD_BYTES
        with self._bcrypt_lock:
            # A too-long password still pays for one check, so it is no faster to refuse.
            matches = bcrypt.checkpw(password[:_MAX_PASSWORD_BYTES], stored)
        return matches and not too_long


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
