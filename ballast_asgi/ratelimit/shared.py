"""What the three Redis-backed modes share: calls under a deadline, the breaker,
the fallback share, charge-back and the heartbeats that count live gateways.

A call on the request path gets ``timeout_s`` (``redis_timeout_ms``). The call
is not cancelled when it misses that deadline (cancelling a redis-py call
throws its connection away): the request is decided on this gateway's share
at once, the call finishes in the background, and ``on_late`` reconciles its
answer with what was decided. A miss and an error both count as failures for
the breaker. While the breaker is open no call is made at all. Once a call
has ended in an error (Redis refused or reset the connection) Redis is
``failing``: until a call succeeds again, request-path calls still go out
(one of them finds Redis back) but no request waits for one; a stopped Redis
costs a busy gateway no event-loop turns per request before the breaker
opens.

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
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ballast_asgi.core.redact import redact_userinfo
from ballast_asgi.core.types import Clock
from ballast_asgi.ratelimit.client import RedisClient, RedisPoolFull, RedisUnavailable
from ballast_asgi.ratelimit.core.accounting import ChargeBook
from ballast_asgi.ratelimit.core.breaker import Breaker, RedisBreaker
from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.local import LocalBuckets
from ballast_asgi.ratelimit.stats import RateLimitStats
from ballast_asgi.telemetry.events import emit

#: Background calls (heartbeat, sync, give-back, charge-back) may take this long.
BACKGROUND_TIMEOUT_S = 0.5
#: A gateway counts as live for three heartbeat periods, and at least this long.
MIN_LIVE_TTL_S = 3.0


class Missed(Exception):
    """A request-path call did not answer within its deadline (or failed)."""


class SharedBase:
    """Base of the ``redis``, ``lease`` and ``sync`` drivers."""

    mode = "shared"

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
        self.client = client
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.breaker: Breaker = breaker if breaker is not None else RedisBreaker()
        self.heartbeat_s = heartbeat_s
        self.charge_back = charge_back
        self.clock = clock
        self.id = uuid.uuid4().hex[:12]
        self.stats = RateLimitStats()
        self.fallback = LocalBuckets(max_keys)
        self.charges = ChargeBook(max_keys)
        self.live = 1
        #: Redis's last finished call ended in an error (refused, reset): until one succeeds,
        #: no request waits for Redis.
        self.failing = False
        #: Whether Redis answered the last call that said anything (None: no answer yet);
        #: its changes are the ``ratelimit.redis_*`` events (docs/operations.md).
        self.reachable: bool | None = None
        self._lost_at = 0.0
        self._last_beat = -math.inf
        self._tasks: set[asyncio.Task[Any]] = set()
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

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background, keeping a reference until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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

    # -- calls --------------------------------------------------------------
    def key(self, *parts: str) -> str:
        """A namespaced Redis key (``{prefix}`` hash-tagged for a cluster)."""
        return ":".join(("{" + self.prefix + "}", *parts))

    async def call(
        self,
        op: str,
        keys: Sequence[str],
        args: Sequence[Any],
        *,
        timeout_s: float | None = None,
        on_late: Callable[[Any], None] | None = None,
        request_path: bool = True,
    ) -> Any:
        """One script call under the breaker and a deadline; raise ``Missed`` when it fails.

        On the request path, while Redis is ``failing`` (its last call ended in an error),
        the call still goes out (it finds out when Redis is back, and the breaker counts
        it) but nobody waits for it: ``Missed`` at once, the answer goes to ``on_late``.
        """
        now = self.clock()
        if not self.breaker.allow(now):
            raise Missed("breaker open")
        task = asyncio.get_running_loop().create_task(self._timed(op, keys, args))
        if self.failing and request_path:
            self._adopt(op, task, on_late, record=True)
            raise Missed("failing")
        done, _ = await asyncio.wait((task,), timeout=timeout_s or self.timeout_s)
        if not done:
            self.breaker.record(False, self.clock())
            self._adopt(op, task, on_late, record=False)
            raise Missed("deadline")
        exc = task.exception()
        self._outcome(exc, record=True)
        if exc is not None:
            raise Missed(str(exc)) from exc
        return task.result()

    def _outcome(self, exc: BaseException | None, *, record: bool) -> None:
        """A call ended (``exc`` None: it succeeded): tell the breaker (unless a missed
        deadline already did), track ``failing``, and flush pending charge-back once Redis
        answers again. Only an error from Redis makes it ``failing``: a full connection
        pool is this process's saturation and a background deadline a slow answer; both
        count for the breaker (when recorded) but do not stop requests from waiting."""
        ok = exc is None
        if record:
            self.breaker.record(ok, self.clock())
        if ok:
            self.failing = False
            self._reachability(True, None)
        elif isinstance(exc, RedisUnavailable) and not isinstance(exc, RedisPoolFull):
            self.failing = True
            self._reachability(False, exc)
        if ok and len(self.charges) and not self._flushing and not self._closed:
            self.spawn(self.flush_charges())

    def _reachability(self, ok: bool, exc: BaseException | None) -> None:
        """Log Redis unreachable at start-up, lost, and back (state changes only)."""
        if ok == self.reachable:
            return
        was, self.reachable = self.reachable, ok
        url, now = redact_userinfo(self.client.url), self.clock()
        if ok:
            if was is False:
                emit("ratelimit.redis_back", "info", mode=self.mode, redis=url,
                     down_s=round(now - self._lost_at, 3))  # fmt: skip
            return
        self._lost_at = now
        event = "ratelimit.redis_unreachable" if was is None else "ratelimit.redis_lost"
        emit(event, "error" if was is None else "warning", mode=self.mode, redis=url,
             error=str(exc), fallback=f"local share 1/{self.live}")  # fmt: skip

    def lost_reasons(self) -> list[str]:
        """Why the limit is not shared now (health ``degraded``): Redis not answering."""
        if self.reachable is False:
            url = redact_userinfo(self.client.url)
            return [f"rate_limit: Redis {url} unreachable; deciding on the local share"]
        return []

    def _adopt(
        self,
        op: str,
        task: asyncio.Task[Any],
        on_late: Callable[[Any], None] | None,
        *,
        record: bool,
    ) -> None:
        """Keep a call nobody waits for; when it ends, count it and hand its answer on."""

        def done(task: asyncio.Task[Any]) -> None:
            self._tasks.discard(task)
            self.stats.redis_calls[(op, "late")] += 1
            if task.cancelled():
                return
            exc = task.exception()
            self._outcome(exc, record=record)
            if on_late is not None:
                on_late(None if exc is not None else task.result())

        self._tasks.add(task)
        task.add_done_callback(done)

    async def _timed(self, op: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        start = time.perf_counter()
        try:
            result = await self.client.run(op, keys, args)
        except RedisUnavailable:
            self.stats.call(op, "error", None)
            raise
        self.stats.call(op, "ok", time.perf_counter() - start)
        return result

    async def background(self, op: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """A call off the request path (longer deadline, still under the breaker)."""
        return await self.call(op, keys, args, timeout_s=BACKGROUND_TIMEOUT_S, request_path=False)

    async def bookkeeping(self, op: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """A heartbeat or a give-back: outside the breaker, bounded by the background deadline.

        The breaker protects the request path. These calls are few (a couple a second)
        and must not be dropped while it is open: a heartbeat that does not land for
        three periods drops this gateway from its peers' live count (each of them then
        decides alone on a larger share), and a dropped give-back loses tokens. Their
        outcome does not move the breaker; it does tell whether Redis is ``failing``.
        """
        try:
            result = await asyncio.wait_for(self._timed(op, keys, args), BACKGROUND_TIMEOUT_S)
        except (RedisUnavailable, TimeoutError) as exc:
            self._outcome(exc, record=False)
            raise Missed(str(exc)) from exc
        self._outcome(None, record=False)
        return result

    # -- degraded decisions and charge-back -----------------------------------
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

    def breaker_state(self) -> str:
        """closed, open or half_open."""
        return self.breaker.state(self.clock())

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
