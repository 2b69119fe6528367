"""``sync`` mode: local buckets that reconcile with Redis between requests, never on the path.

Every request is decided at once from a local GCRA bucket holding this
gateway's *share* of the key's limit. Every ``interval_s`` one pipelined round
trip (``SYNC`` per active key) does three things per key:

1. charges the shared bucket with what this gateway admitted since the last
   sync (spread over that interval);
2. publishes this gateway's recent demand (requests/s offered for the key) and
   reads the total over the gateways that published within ``stale_s``;
3. takes this gateway's part of any excess of the shared bucket over its
   tolerance as local debt (so a transient overshoot is paid back once).

A key's demand is published once its estimate has ``MATURE_S`` (0.1 s) of
history; until then this gateway holds ``1 / live`` and its peers count it as
offering their average (a 10 ms estimate read a fifth of the real rate, and a
peer that divided the limit by it took 0.8 of it while this gateway still held
half: +1.1 % over a perfect bucket in the experiment, all in a new key's first
0.5 s).

The share (``accounting.demand_share``) splits the limit by demand: with total demand ``D``
below the rate ``R`` each gateway gets its own demand plus an even part of the
headroom ``(R - D) / n`` (room for a spike at once); above it, ``R * d / D``.
The shares add up to the limit in both cases. While Redis does not answer, the
share falls back to ``1 / live gateways`` and decisions count as degraded; the
requests admitted meanwhile are charged at the next sync that succeeds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ballast_asgi.ratelimit.client import RedisUnavailable
from ballast_asgi.ratelimit.core import gcra
from ballast_asgi.ratelimit.core.accounting import RateEstimate, demand_share
from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.core.table import KeyTable
from ballast_asgi.ratelimit.shared import BACKGROUND_TIMEOUT_S, SharedBase


@dataclass(slots=True, eq=False)
class SyncState:
    """One key's local bucket on this gateway."""

    tat: float
    share: float
    limits: Limits
    unsynced: int = 0
    last_seen: float = 0.0
    #: The demand this gateway published at its last sync: its share is computed from
    #: this same number, not from a new estimate taken after the round trip (requests
    #: that arrived meanwhile would make it disagree with what the peers read).
    published: float = 0.0
    demand: RateEstimate = field(default_factory=lambda: RateEstimate(0.5))


def _sync_debt(state: SyncState, now: float) -> bool:
    return state.tat > now or state.unsynced > 0


class SyncLimiter(SharedBase):
    """The ``sync`` mode driver."""

    mode = "sync"

    def __init__(
        self, *args: Any, interval_s: float = 0.2, max_keys: int = 10_000, **kwargs: Any
    ) -> None:
        super().__init__(*args, max_keys=max_keys, **kwargs)
        self.interval_s = interval_s
        self.stale_s = max(0.5, 5 * interval_s)
        self.states: KeyTable[SyncState] = KeyTable(max_keys, _sync_debt)
        self.degraded = False
        self._last_sync = time.monotonic()

    def start_loops(self) -> None:
        """The reconcile loop."""
        self._last_sync = self.clock()
        self.spawn(self._every(self.interval_s, self.sync_once))

    async def decide(self, key: str, limits: Limits) -> Decision:
        """Decide from the local share bucket; never waits for Redis."""
        self.ensure_started()
        now = self.clock()
        state = self.states.get(key)
        if state is None:
            state = SyncState(now, 1.0 / max(1, self.live), limits)
            self.states.put(key, state, now)
        state.limits = limits
        state.last_seen = now
        state.demand.add(now)
        share = 1.0 / max(1, self.live) if self.degraded else state.share
        decision, state.tat = gcra.decide(state.tat, now, limits.scaled(share))
        if decision.allowed:
            state.unsynced += 1
        self.stats.decided(decision.allowed, "degraded" if self.degraded else "local")
        decision = Decision(
            decision.allowed, decision.remaining, decision.retry_after_s, decision.reset_s, limits,
            degraded=self.degraded,
        )  # fmt: skip
        return decision

    async def sync_once(self) -> None:
        """One pipelined reconcile of every key seen within ``stale_s``."""
        now = self.clock()
        active = [(k, s) for k, s in self.states.items() if now - s.last_seen <= self.stale_s]
        if not active:
            self._last_sync = now
            return
        since = now - self._last_sync
        calls = [self._call(k, s, now, since) for k, s in active]
        counts = [s.unsynced for _, s in active]
        for _, s in active:
            s.unsynced = 0
        if not self.breaker.allow(now):
            self._failed(active, counts)
            return
        start = time.perf_counter()
        try:
            replies = await _bounded(self.client.run_many(calls))
        except RedisUnavailable:
            self.breaker.record(False, self.clock())
            self.stats.call("sync", "error", None)
            self._failed(active, counts)
            return
        self.breaker.record(True, self.clock())
        self.stats.call("sync", "ok", time.perf_counter() - start)
        self._last_sync = now
        self.degraded = False
        for (_, state), reply in zip(active, replies, strict=True):
            self._apply(state, reply, now)

    def _call(
        self, key: str, state: SyncState, now: float, since: float
    ) -> tuple[str, list[str], list[Any]]:
        lim = state.limits
        # A demand estimate younger than MATURE_S reads low; a peer dividing the limit by it
        # would take what this gateway still holds. Until then: not published (-1).
        known = state.demand.known(now)
        state.published = round(state.demand.rate(now), 3) if known else -1.0
        args = [
            repr(lim.interval_s), repr(lim.tau_s), state.unsynced, self.id,
            f"{state.published:.3f}", self.stale_s, f"{state.share:.6f}", f"{since:.6f}",
        ]  # fmt: skip
        return "sync", [self.key("b", key), self.key("d", key)], args

    def _apply(self, state: SyncState, reply: Any, now: float) -> None:
        total, published, taken = float(reply[0]), int(reply[1]), float(reply[2])
        # A peer that has not yet published demand for this key (a new key, a gateway
        # that just started, an estimate younger than MATURE_S) still counts: its share
        # is held for it, so the first sync of a key does not hand it to another gateway.
        if state.published < 0:
            # Not published: the peers count this gateway as holding 1 / live (the average
            # of theirs, ``demand_share``), so it must hold no more than that.
            state.share = 1.0 / max(published + 1, self.live)
        else:
            live = max(published, self.live)
            rate = state.limits.rate_per_s
            state.share = demand_share(state.published, total, live, rate, published)
        if taken > 0:
            state.tat = max(state.tat, now) + taken / state.share

    def _failed(self, active: list[tuple[str, SyncState]], counts: list[int]) -> None:
        self.degraded = True
        for (_, state), count in zip(active, counts, strict=True):
            state.unsynced += count

    def snapshot(self) -> dict[str, Any]:
        """The shared snapshot plus the local table and whether it is degraded."""
        doc = super().snapshot()
        doc["sync_keys"] = self.states.snapshot()
        doc["degraded"] = self.degraded
        return doc


async def _bounded(coro: Any) -> Any:
    try:
        return await asyncio.wait_for(coro, BACKGROUND_TIMEOUT_S)
    except TimeoutError as exc:
        raise RedisUnavailable("sync timed out") from exc
