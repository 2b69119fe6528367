"""What the three Redis-backed modes share: the fallback share, charge-back and
the heartbeats that count live gateways (calls under a deadline and the breaker
are the base class, ``redis_calls.RedisCalls``; ``Missed`` and
``BACKGROUND_TIMEOUT_S`` are importable from here too).

A request-path call that misses its deadline, or that finds Redis ``failing``,
is decided on this gateway's share at once (``degrade``); the call finishes in
the background and ``on_late`` reconciles its answer with what was decided. A
stopped Redis costs a busy gateway no event-loop turns per request before the
breaker opens. What was admitted alone is charged to the shared buckets once
Redis answers again (``flush_charges``).

The fallback share is ``limit / live gateways`` (``Limits.scaled``; ``redis``
mode splits it by demand instead, ``redis_mode.py``), the live count learned
from heartbeats: each gateway adds itself to a sorted set every
``heartbeat_s`` and counts the members seen within ``live_ttl_s`` (three
periods, and never less than ``MIN_LIVE_TTL_S``: a gateway whose event loop
is a second behind must not drop out of its peers' count, which would hand
each of them a larger share exactly when the machine is overloaded). A mode
whose own calls carry the heartbeat (``lease``: every lease call is also a
heartbeat) reports them with ``saw_beat``, and the periodic heartbeat is then
skipped while those calls are frequent enough: a busy gateway makes no
heartbeat trips of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from ballast_asgi.core.types import Clock
from ballast_asgi.ratelimit.client import RedisClient, RedisUnavailable
from ballast_asgi.ratelimit.core.accounting import ChargeBook
from ballast_asgi.ratelimit.core.breaker import Breaker
from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.local import LocalBuckets
from ballast_asgi.ratelimit.redis_calls import BACKGROUND_TIMEOUT_S, Missed, RedisCalls

#: A gateway counts as live for three heartbeat periods, and at least this long.
MIN_LIVE_TTL_S = 3.0


class SharedBase(RedisCalls):
    """Base of the ``redis``, ``lease`` and ``sync`` drivers."""

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str = "ballast:rl",
        timeout_s: float = 0.002,
        max_keys: int = 10_000,
        breaker: Breaker | None = None,
        heartbeat_s: float = 0.5,
        charge_back: bool = True,
        clock: Clock = time.monotonic,
    ) -> None:
        super().__init__(client, prefix=prefix, timeout_s=timeout_s, breaker=breaker, clock=clock)
        self.heartbeat_s = heartbeat_s
        self.charge_back = charge_back
        self.id = uuid.uuid4().hex[:12]
        self.fallback = LocalBuckets(max_keys)
        self.charges = ChargeBook(max_keys)
        self._last_beat = -math.inf
        self._started = False
        self._flushing = False
        self._closed = False

    # -- lifecycle ----------------------------------------------------------
    def ensure_started(self) -> None:
        """Start the background loops on first use, in the running loop."""
        if not self._started and not self._closed:
            self._started = True
            self.spawn(self._warm_then_beat())
            self.start_loops()

    async def start(self) -> None:
        """Start the loops and count the live gateways before the first decision.

        Called on ``lifespan.startup`` (and for a driver built by a reload), so a
        gateway does not decide as if it were alone until its first periodic
        heartbeat. Bounded by the background deadline; a Redis that does not
        answer leaves ``live`` at 1 and the loops retry.
        """
        self.ensure_started()
        with contextlib.suppress(RedisUnavailable, Missed, TimeoutError):
            await asyncio.wait_for(self.heartbeat(), BACKGROUND_TIMEOUT_S)

    async def _warm_then_beat(self) -> None:
        with contextlib.suppress(RedisUnavailable, TimeoutError):
            await asyncio.wait_for(self.client.warm_up(), BACKGROUND_TIMEOUT_S)
        await self._every(self.heartbeat_s, self._heartbeat_if_due)

    def start_loops(self) -> None:
        """Mode-specific background loops (none by default)."""

    async def _every(self, period_s: float, step: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        while not self._closed:
            with contextlib.suppress(RedisUnavailable, Missed):
                await step()
            await asyncio.sleep(period_s)

    async def close(self) -> None:
        """Stop the loops, leave the heartbeat set, close the pool."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(RedisUnavailable, TimeoutError):
            await asyncio.wait_for(self.client.run("leave", [self.key("gw")], [self.id]), 0.2)
        await self.client.close()

    # -- degraded decisions and charge-back -----------------------------------
    def answered(self) -> None:
        """Redis answers again: charge what was admitted alone meanwhile."""
        if len(self.charges) and not self._flushing and not self._closed:
            self.spawn(self.flush_charges())

    def share(self, key: str, now: float) -> float:
        """This gateway's fraction of ``key``'s limit when it decides alone: 1 / live."""
        return 1.0 / max(1, self.live)

    def count_admitted(self, key: str, limits: Limits, now: float) -> None:
        """Take what Redis admitted for this gateway from its own share too.

        The share (``rate / live``, ``burst / live``) is what this gateway may admit
        when it decides alone. Counting every admission through Redis against it
        (a GCRA answer, a lease token) keeps a gateway whose event loop is late,
        and so decides some requests alone and some through Redis, from admitting
        its full share alone on top of what Redis admitted: over-admission of 10 %
        and more at 150 % of the limit, measured in the experiment before this. The
        share may go one burst into debt, not more (``LocalBuckets.spend``), so a
        gateway that served more than its share through Redis owes little when
        Redis goes away.
        """
        self.fallback.spend(key, limits.scaled(self.share(key, now)), now)

    def degrade(self, key: str, limits: Limits, now: float) -> Decision:
        """Decide on this gateway's share; remember what was admitted for charge-back."""
        decision = self.fallback.decide(key, limits.scaled(self.share(key, now)), now)
        if decision.allowed and self.charge_back:
            self.charges.add(key, now, limits.interval_s)
        self.stats.decided(decision.allowed, "degraded")
        return _degraded(decision, limits)

    async def flush_charges(self) -> None:
        """Charge what was admitted alone to the shared buckets, in one pipeline."""
        self._flushing = True
        try:
            now = self.clock()
            items = self.charges.drain(now, max_age_s=60.0)
            calls = [
                ("charge", [self.key("b", k)], [interval, 0, n, f"{age:.6f}"])
                for k, n, age, interval in items
            ]
            if not calls:
                return
            try:
                results = await asyncio.wait_for(self.client.run_many(calls), BACKGROUND_TIMEOUT_S)
            except (RedisUnavailable, TimeoutError):
                self.charges.restore(items, now)
                return
            for (_, n, _, _), charged in zip(items, results, strict=True):
                if int(charged):
                    self.stats.charged_back += n
                else:
                    self.stats.charge_lapsed += n
        finally:
            self._flushing = False

    # -- heartbeats -----------------------------------------------------------
    async def heartbeat(self) -> None:
        """Announce this gateway and learn how many are alive."""
        live = await self.bookkeeping("heartbeat", [self.key("gw")], self.beat_args())
        self.saw_beat(live)

    async def _heartbeat_if_due(self) -> None:
        """The periodic heartbeat, unless a call that carried one answered in the last half period.

        Half, not a whole one: the loop's sleep may wake a hair early (uvloop's timers have
        millisecond resolution), and a beat skipped by that hair would space this gateway's
        own beats a whole extra period apart, close to the three periods after which its
        peers stop counting it.
        """
        if self.clock() - self._last_beat >= 0.5 * self.heartbeat_s:
            await self.heartbeat()

    def beat_args(self) -> list[Any]:
        """This gateway's id and the heartbeat set's time to live, for a script that beats."""
        return [self.id, self.live_ttl_s]

    @property
    def live_ttl_s(self) -> float:
        """A gateway counts as live this long after its last heartbeat."""
        return max(3 * self.heartbeat_s, MIN_LIVE_TTL_S)

    def saw_beat(self, live: Any) -> None:
        """A heartbeat answered (on its own or carried by another call): ``live`` gateways."""
        self._last_beat = self.clock()
        self.live = max(1, int(live))

    def live_gateways(self) -> int:
        """Gateways seen by the last heartbeat (1 until the first answer)."""
        return self.live

    def snapshot(self) -> dict[str, Any]:
        """Mode, breaker, live gateways, pending charge-back, fallback table and counts."""
        return {
            "mode": self.mode,
            "gateway_id": self.id,
            "live_gateways": self.live,
            "breaker": self.breaker_state(),
            "pending_charge_back_keys": len(self.charges),
            "fallback_keys": self.fallback.table.snapshot(),
            **self.stats.snapshot(),
        }


def _degraded(decision: Decision, limits: Limits) -> Decision:
    return Decision(
        decision.allowed,
        decision.remaining,
        decision.retry_after_s,
        decision.reset_s,
        limits,
        degraded=True,
    )


__all__ = ["BACKGROUND_TIMEOUT_S", "MIN_LIVE_TTL_S", "Missed", "SharedBase"]
