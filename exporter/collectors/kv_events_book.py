"""The kv_events collector's book of every engine's residency, and what the engine state
tells it of each engine (pool size, offload tiers, restarts, endpoint, freshness)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.collectors.error_tally import ErrorTally
from exporter.collectors.kv_events_log import LimitedLog
from exporter.collectors.kv_events_subscription import LOGGER
from exporter.prefix_cache import DEFAULT_MAX_BLOCKS, DEFAULT_MAX_GROUPS, EngineResidency
from exporter.state import KvEventsEndpoint, ResidencyView, Snapshot


@dataclass(frozen=True, slots=True)
class EngineHint:
    """What the engine state knows about one engine that the residency needs."""

    num_gpu_blocks: int | None
    restarts: int  # restarts the state noticed so far
    kv_events: KvEventsEndpoint | None
    tier_blocks: dict[str, int] | None = None  # offload medium -> its blocks, where known


def engine_hints(snapshot: Snapshot) -> dict[str, EngineHint]:
    return {
        view.engine: EngineHint(
            view.capacity.num_gpu_blocks,
            snapshot.restarts.get(view.engine, 0),
            view.kv_events,
            {t.medium: t.capacity_blocks for t in view.offload if t.capacity_blocks},
        )
        for view in snapshot.engines
    }


class ResidencyBook:
    """Every engine's residency, by engine label; the collector's thread alone uses it."""

    def __init__(
        self,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        max_groups: int = DEFAULT_MAX_GROUPS,
        log: LimitedLog | None = None,
    ) -> None:
        self.log = log or LimitedLog(LOGGER)
        self._max_blocks = max_blocks
        self._max_groups = max_groups
        self._engines: dict[str, EngineResidency] = {}
        self._restarts: dict[str, int] = {}

    def engine(self, engine: str) -> EngineResidency:
        found = self._engines.get(engine)
        if found is None:
            found = EngineResidency(engine, self._max_blocks, self._max_groups)
            self._engines[engine] = found
        return found

    def forget_unfollowed(self, known: Mapping[str, object], followed: set[str]) -> list[str]:
        """Drop the residency of engines the state no longer knows and no stream feeds
        (a forgotten engine, an endpoint that moved away): what was dropped."""
        gone = [e for e in self._engines if e not in known and e not in followed]
        for engine in gone:
            del self._engines[engine]
            self._restarts.pop(engine, None)
        return gone

    def tally_bound_hits(self, tally: ErrorTally) -> None:
        """The residency bounds hit since the last tick, as the collector's errors."""
        for engine, residency in self._engines.items():
            for reason, count in residency.take_bound_hits().items():
                tally.count(reason, engine, f"engine {engine}: {reason}", count)
                self.log.warning("kv_events_bound_hit", engine=engine, reason=reason)

    def changed(self) -> list[ResidencyView]:
        """The records of the engines that moved since the last call."""
        return [e.view() for e in self._engines.values() if e.changed]

    def apply_hints(self, hints: Mapping[str, EngineHint]) -> None:
        """Pool sizes bound the sets; a restart the state noticed empties the cache."""
        for engine, residency in self._engines.items():
            hint = hints.get(engine)
            if hint is None:
                continue
            residency.set_pool_blocks(hint.num_gpu_blocks, hint.tier_blocks)
            before = self._restarts.get(engine)
            self._restarts[engine] = hint.restarts
            if before is not None and hint.restarts > before:
                self.log.info("engine_restarted_residency_cleared", engine=engine)
                residency.reset()
