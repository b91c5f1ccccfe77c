"""Who the handshake receiver lets in: one instance per engine, message rates, series rows.

An engine index is held by the instance (vLLM's `instance_id` and the plugin's `bye_token`)
whose message first claimed it. While that instance is live (heard within its stale
window) a message of another instance for the index is refused, unless it carries the
held instance's token (the same process started a new instance): a heartbeat cannot swap
the token a bye must repeat, and a storm of new instance ids cannot flip an engine back
and forth (each flip a restart, a log line and a re-render). An instance leaves by its bye,
by going silent past its stale window, or by being forgotten; then the next instance takes
the index (a restart, which the state notices). A v1 plugin sends no heartbeat: its
engines have no liveness and any instance may take their index, as before.

Rates: each known engine has its own budget besides the global one, so one engine's flood
cannot use up the messages of the others; and a heartbeat of a held instance that is due
(half its interval, at least `DUE_AFTER_S`, since its last accepted message) passes even
when the global budget is spent, so honest engines stay current under any flood.

Rows: the groups and workers of an engine each make a row of every per-group and
per-worker family, its devices a string each in /engines; they are capped per engine and
summed over engines within one budget, so `/metrics` and `/engines` stay bounded. A
refused message changes nothing.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.collectors.handshake_settings import STALE_AFTER_HEARTBEATS, HandshakeSettings

# The shortest time an instance holds its index after its last message, whatever interval
# it announces: a forged engine announcing the 50 ms minimum cannot flip every 150 ms.
MIN_HOLD_S = 1.0
# The least time between two accepted heartbeats of one instance that pass a spent global
# budget: with --handshake.max-engines engines, at most that many extra messages a second.
DUE_AFTER_S = 1.0


class RateGuard:
    """A token bucket: at most `rate` messages per second, bursts of `rate` (at least 1)."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.tokens = max(rate, 1.0)
        self.clock = clock
        self.last = clock()

    def allow(self) -> bool:
        now = self.clock()
        self.tokens = min(max(self.rate, 1.0), self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class Refused(Exception):
    """A well-formed message that is not applied: (reason, message) for the counters."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Claim:
    """What one ready message says about the instance that sent it."""

    engine: str
    instance_id: str | None
    bye_token: str | None
    interval_s: float | None  # None: a v1 plugin (no heartbeat)
    groups: int
    workers: int
    devices: int  # CUDA_VISIBLE_DEVICES entries: each a string in /engines

    @property
    def rows(self) -> int:
        return self.groups + self.workers + self.devices


@dataclass(slots=True)
class HeldEngine:
    """The instance an engine index is held by, and when it was last heard."""

    instance_id: str | None
    bye_token: str | None
    interval_s: float | None
    heard_at_s: float
    rows: int
    budget: RateGuard
    stale: bool = False


def _same_token(held: str | None, told: str | None) -> bool:
    if held is None or told is None:
        return held is told
    return hmac.compare_digest(held.encode(), told.encode())


class Admission:
    """The engines the receiver holds, and the rules a message must pass to change them."""

    def __init__(
        self, settings: HandshakeSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        # The limits are the handshake's settings: engines, rates, groups, workers, rows.
        self.limits = settings
        self.clock = clock
        self.held: dict[str, HeldEngine] = {}
        self.guard = RateGuard(settings.max_messages_per_s, clock)
        self.rows = 0  # groups + workers + devices over every held engine

    def stale_window_s(self, held: HeldEngine) -> float:
        assert held.interval_s is not None
        return self.limits.stale_after_s or STALE_AFTER_HEARTBEATS * held.interval_s

    def _holds(self, held: HeldEngine, now: float) -> bool:
        """Whether the held instance is live: no other may take its index yet."""
        if held.interval_s is None or held.stale:
            return False
        return now - held.heard_at_s <= max(self.stale_window_s(held), MIN_HOLD_S)

    def admit_ready(self, claim: Claim) -> None:
        """Hold `claim`'s engine for its instance, or raise Refused; nothing changes then."""
        limits, now = self.limits, self.clock()
        held = self.held.get(claim.engine)
        same_token = held is not None and _same_token(held.bye_token, claim.bye_token)
        same = held is not None and held.instance_id == claim.instance_id and same_token
        # The held instance's own process (its token) may start a new instance at once.
        successor = held is not None and held.bye_token is not None and same_token
        if held is not None and not same and not successor and self._holds(held, now):
            if held.instance_id == claim.instance_id:
                raise Refused(
                    "token_mismatch", f"engine {claim.engine}: not the bye token of its instance"
                )
            raise Refused(
                "instance_conflict",
                f"engine {claim.engine} is held by a live instance; another claimed it",
            )
        if claim.groups > limits.max_groups_per_engine:
            raise Refused(
                "too_many_groups",
                f"{claim.groups} KV cache groups, over {limits.max_groups_per_engine}",
            )
        if claim.workers > limits.max_workers_per_engine:
            raise Refused(
                "too_many_workers", f"{claim.workers} workers, over {limits.max_workers_per_engine}"
            )
        if claim.devices > limits.max_workers_per_engine:
            raise Refused(
                "too_many_devices", f"{claim.devices} devices, over {limits.max_workers_per_engine}"
            )
        if held is None and len(self.held) >= limits.max_engines:
            raise Refused("too_many_engines", f"more than {limits.max_engines} engines known")
        rows = self.rows - (held.rows if held else 0) + claim.rows
        if rows > limits.max_series_rows:
            raise Refused(
                "series_budget",
                f"engines' groups and workers would be {rows}, over {limits.max_series_rows}",
            )
        self._charge(held, due=same and held is not None and self._due(held, now))
        if held is not None and same:
            held.heard_at_s, held.stale = now, False
            held.interval_s, held.rows = claim.interval_s, claim.rows
        else:
            budget = (
                held.budget if held else RateGuard(limits.max_messages_per_engine_per_s, self.clock)
            )
            self.held[claim.engine] = HeldEngine(
                claim.instance_id,
                claim.bye_token,
                claim.interval_s,
                now,
                claim.rows,
                budget,
            )
        self.rows = rows

    def admit_bye(self, engine: str, instance_id: str | None, bye_token: str | None) -> None:
        """Let a bye through (the caller removes the engine), or raise Refused."""
        held = self.held.get(engine)
        # An instance that sent a token leaves only on a bye that repeats it; one that sent
        # none (an older plugin) leaves on a bye without one, as before.
        if (
            held is not None
            and held.bye_token is not None
            and not _same_token(held.bye_token, bye_token or "")
        ):
            raise Refused("bye_refused", f"a bye for engine {engine} without its token")
        self._charge(held, due=False)
        if held is not None and held.instance_id == instance_id:
            self.forget(engine)

    def sweep(self) -> tuple[list[tuple[str, HeldEngine]], list[tuple[str, HeldEngine]]]:
        """The liveness windows applied now, to the engines of a heartbeating plugin (a v1
        plugin's have no liveness): (forgotten, stale), the instances silent past the forget
        window, which no longer hold their index, and those silent past their stale window
        for the first time, now marked stale; each with its engine."""
        now = self.clock()
        forgotten: list[tuple[str, HeldEngine]] = []
        stale: list[tuple[str, HeldEngine]] = []
        for engine, held in list(self.held.items()):
            if held.interval_s is None:
                continue
            silent_s = now - held.heard_at_s
            if silent_s > self.limits.forget_after_s:
                self.forget(engine)
                forgotten.append((engine, held))
            elif silent_s > self.stale_window_s(held) and not held.stale:
                held.stale = True
                stale.append((engine, held))
        return forgotten, stale

    def forget(self, engine: str) -> None:
        held = self.held.pop(engine, None)
        if held is not None:
            self.rows -= held.rows

    def _due(self, held: HeldEngine, now: float) -> bool:
        interval_s = held.interval_s
        return interval_s is not None and now - held.heard_at_s >= max(interval_s / 2, DUE_AFTER_S)

    def _charge(self, held: HeldEngine | None, *, due: bool) -> None:
        if held is not None and not held.budget.allow():
            raise Refused(
                "engine_rate_limited",
                "more messages of one engine than --handshake.max-rate-per-engine",
            )
        if not self.guard.allow() and not due:
            raise Refused("rate_limited", "more messages than --handshake.max-rate")
