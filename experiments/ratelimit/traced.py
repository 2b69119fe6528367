"""The gateway app with a per-request trace, for the experiment's decision-time check.

``uvicorn experiments.ratelimit.traced:app`` serves ``ballast_asgi.gateway:app``
unchanged and records, for every request carrying ``x-seq``, the moment it
reached the app (``time.monotonic()``: the rate-limit stage decides within
microseconds of it; in ``local`` and ``sync`` mode nothing awaits before the
decision) and the status it answered. ``GET /_trace`` returns the records as
JSON and clears them. On Linux ``time.monotonic()`` and the generator's
``time.perf_counter()`` read the same clock (``CLOCK_MONOTONIC``), so the
gateways' decision times and the generator's send times can be compared.

It also times every rate-limit decision (the drivers' ``decide``, the span the
gateway's ``decision_wait`` histogram measures) in wall-clock and in this
thread's CPU time, and every garbage collection (``gc.callbacks``). A decision
over 1 ms is kept with both times and the collections that ran inside it: CPU
time close to the wall time is work in the process (a collection, the code),
wall time far above it is the process not running (preempted by the kernel).
"""

from __future__ import annotations

import gc
import json
import time
from typing import Any

from ballast_asgi.core.types import ASGIApp, Message, Receive, Scope, Send
from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.lease import LeaseLimiter
from ballast_asgi.ratelimit.redis_mode import RedisLimiter
from ballast_asgi.ratelimit.sync import SyncLimiter
from ballast_asgi.server.serve import adopt_loading

#: A decision or a collection longer than this is kept in the trace.
SLOW_S = 0.001


class Timings:
    """Decisions and garbage collections in this process, the slow ones kept."""

    def __init__(self) -> None:
        self.decisions = 0
        #: (monotonic end, wall ms, cpu ms, collections inside, their ms)
        self.slow: list[tuple[float, float, float, int, float]] = []
        #: (monotonic end, generation, ms) of collections over ``SLOW_S``
        self.pauses: list[tuple[float, int, float]] = []
        self.collections = 0
        self.gc_ms = 0.0
        self._gc_start = 0.0

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """``gc.callbacks`` hook: time each collection."""
        now = time.perf_counter()
        if phase == "start":
            self._gc_start = now
            return
        took = now - self._gc_start
        self.collections += 1
        self.gc_ms += 1000.0 * took
        if took > SLOW_S:
            self.pauses.append((time.monotonic(), int(info["generation"]), 1000.0 * took))

    def dump(self) -> dict[str, Any]:
        """Everything so far, then start again."""
        doc = {"decisions": self.decisions, "slow": self.slow, "pauses": self.pauses,
               "collections": self.collections, "gc_ms": self.gc_ms}  # fmt: skip
        self.decisions, self.slow, self.pauses, self.collections, self.gc_ms = 0, [], [], 0, 0.0
        return doc


TIMINGS = Timings()
gc.callbacks.append(TIMINGS.on_gc)


def _timed(cls: Any) -> None:
    inner = cls.decide

    async def decide(self: Any, key: str, limits: Limits) -> Decision:
        t = TIMINGS
        wall0, cpu0, n0, ms0 = time.perf_counter(), time.thread_time(), t.collections, t.gc_ms
        try:
            return await inner(self, key, limits)  # type: ignore[no-any-return]
        finally:
            wall = time.perf_counter() - wall0
            t.decisions += 1
            if wall > SLOW_S:
                cpu = time.thread_time() - cpu0
                t.slow.append(
                    (time.monotonic(), 1e3 * wall, 1e3 * cpu, t.collections - n0, t.gc_ms - ms0)
                )

    cls.decide = decide


for _cls in (SyncLimiter, LeaseLimiter, RedisLimiter):
    _timed(_cls)


class Traced:
    """Wraps an ASGI app; keeps ``(seq, arrived, status)`` per traced request."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner
        self.records: list[tuple[int, float, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        if scope["path"] == "/_trace":
            await self._dump(send)
            return
        arrived = time.monotonic()
        seq = next((int(v) for k, v in scope["headers"] if k == b"x-seq"), -1)
        if seq < 0:
            await self.inner(scope, receive, send)
            return
        records = self.records

        async def traced_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                records.append((seq, arrived, int(message["status"])))
            await send(message)

        await self.inner(scope, receive, traced_send)

    async def _dump(self, send: Send) -> None:
        body = json.dumps({"requests": self.records, **TIMINGS.dump()}).encode()
        self.records = []
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


_app: Traced | None = None


def __getattr__(name: str) -> Any:
    """Build ``app`` on first access, like ``ballast_asgi.gateway`` (and adopt uvicorn)."""
    global _app
    if name != "app":
        raise AttributeError(name)
    import ballast_asgi.gateway as gateway

    if _app is None:
        _app = Traced(gateway.app)
    adopt_loading(gateway.app, f"{__name__}:app")
    return _app
