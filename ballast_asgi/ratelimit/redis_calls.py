"""Calls to Redis under a deadline and a breaker, and whether Redis is reachable.

``RedisCalls`` is the base of the shared drivers (``shared.SharedBase``). A
call on the request path (``call``) gets ``timeout_s`` (``redis_timeout_ms``).
It is not cancelled when it misses that deadline (cancelling a redis-py call
throws its connection away): ``Missed`` is raised at once, the call finishes
in the background and its answer goes to ``on_late``. A miss and an error both
count as failures for the breaker; while it is open no call is made at all.
Once a call has ended in an error from Redis (refused, reset), Redis is
``failing``: until a call succeeds again, request-path calls still go out (one
of them finds Redis back) but nobody waits for one. ``background`` calls get a
longer deadline; ``bookkeeping`` calls (heartbeats, give-backs) go outside the
breaker. Reachability changes are the ``ratelimit.redis_*`` events; a call that
succeeds calls ``answered`` (the drivers flush their charge-back there).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from ballast_asgi.core.redact import redact_userinfo
from ballast_asgi.core.types import Clock
from ballast_asgi.ratelimit.client import RedisClient, RedisPoolFull, RedisUnavailable
from ballast_asgi.ratelimit.core.breaker import Breaker, RedisBreaker
from ballast_asgi.ratelimit.stats import RateLimitStats
from ballast_asgi.telemetry.events import emit

#: Background calls (heartbeat, sync, give-back, charge-back) may take this long.
BACKGROUND_TIMEOUT_S = 0.5


class Missed(Exception):
    """A request-path call did not answer within its deadline (or failed)."""


class RedisCalls:
    """Script calls to one Redis, under a deadline and a breaker, with reachability."""

    mode = "shared"

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str,
        timeout_s: float,
        breaker: Breaker | None,
        clock: Clock,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.breaker: Breaker = breaker if breaker is not None else RedisBreaker()
        self.clock = clock
        self.stats = RateLimitStats()
        #: Gateways sharing the limit (heartbeats update it; the fallback share is 1/live).
        self.live = 1
        #: Redis's last finished call ended in an error (refused, reset): until one succeeds,
        #: no request waits for Redis.
        self.failing = False
        #: Whether Redis answered the last call that said anything (None: no answer yet);
        #: its changes are the ``ratelimit.redis_*`` events (docs/operations.md).
        self.reachable: bool | None = None
        self._lost_at = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()

    def key(self, *parts: str) -> str:
        """A namespaced Redis key (``{prefix}`` hash-tagged for a cluster)."""
        return ":".join(("{" + self.prefix + "}", *parts))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` in the background, keeping a reference until it ends."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        deadline already did), track ``failing``, and call ``answered`` when Redis
        answered (the drivers flush pending charge-back there). Only an error from Redis
        makes it ``failing``: a full connection pool is this process's saturation and a
        background deadline a slow answer; both count for the breaker (when recorded)
        but do not stop requests from waiting."""
        ok = exc is None
        if record:
            self.breaker.record(ok, self.clock())
        if ok:
            self.failing = False
            self._reachability(True, None)
            self.answered()
        elif isinstance(exc, RedisUnavailable) and not isinstance(exc, RedisPoolFull):
            self.failing = True
            self._reachability(False, exc)

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

    def answered(self) -> None:
        """A call succeeded (Redis answers): nothing more by default."""

    def breaker_state(self) -> str:
        """closed, open or half_open."""
        return self.breaker.state(self.clock())
