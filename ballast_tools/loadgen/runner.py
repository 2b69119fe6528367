"""The open-loop runner on the running loop (uvloop from the CLI).

One task walks the schedule and sends one request at each intended time
``t0 + offset`` whether or not earlier requests returned (open loop: the
target cannot slow the offered load down). Two clients: ``lean`` (default,
``loadgen/lean.py``: HTTP/1.1 on asyncio protocols, a keep-alive pool, no task
per request) and ``aiohttp`` (any URL, https included; about 3x the CPU per
request). For each request:

- ``lag = issue_time - intended_time`` (>= 0; the loop sleeps until a request is
  due and never sends early). Lag is recorded, counts as latency (latency is
  ``completion - intended``, so there is no coordinated omission), and is
  taken off the budget sent in ``X-Deadline-Ms = deadline - lag``.
- A request is *not issued* when ``lag > max_lag_s`` or ``lag >= deadline``
  (``behind``), or when ``max_inflight`` requests are already out
  (``inflight_cap``); it is counted apart, never silently dropped.
- The client gives up at ``deadline - lag + grace_s`` (cancels the request and
  closes its connection) so late requests do not pile up.

Two things keep the generator's own stalls out of the schedule (measured in
``docs/instruments.md``): ``warm_connections`` keep-alive connections are
opened before the first intended send (the lean client), so the first
moments of a run do not pay one ``connect`` per request; and with
``pause_gc`` (the default) the cyclic garbage collector is frozen and paused
while the schedule is offered. A full collection over a few thousand open
connections took 40-130 ms on this machine, during which nothing was sent;
what the generator allocates per request is freed by reference counting, so
the pause costs a few MB per 100,000 requests. Should the tracked objects
still grow past ``GC_GUARD_OBJECTS`` a collection runs anyway (counted in
``RunResult.gc_collections``), and the collector is restored afterwards.

The runner reports its own schedule-lag percentiles and CPU time
(``time.process_time``) so a reader can tell when the generator, not the
target, was the bottleneck. ``LoadRunner.stats`` can be read while the run is
in progress (the demo's live view does).
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp
from yarl import URL

from ballast_tools.loadgen.lean import LeanPool, request_prefix
from ballast_tools.loadgen.record import Outcome, Record, RunStats, classify
from ballast_tools.loadgen.schedule import DEFAULT_TIERS, Schedule, Tier, build_schedule

CLIENTS = ("lean", "aiohttp")
#: ``finish(i, status, reason, detail)``: request ``i`` of the schedule ended.
Finish = Callable[[int, int, str | None, str], None]
START_DELAY_S = 0.05
#: uvloop rounds timer delays to whole milliseconds against a cached loop time,
#: so a sleep can end up to ~1 ms early; sleeping this much longer (and
#: re-checking a precise clock) means a request is never sent before its time.
TIMER_SLACK_S = 0.0005
#: When this far behind, yield to the loop after each request: a backlog issued
#: in one burst would find every pooled connection busy and open hundreds of new
#: ones, costing more CPU per request and falling further behind.
BEHIND_S = 0.002
#: With the collector paused, collect anyway once this many tracked objects
#: have accumulated (a bound on memory, far above a normal run's growth).
GC_GUARD_OBJECTS = 2_000_000
#: At most this many requests are issued per pump (see ``LoadRunner._pump``).
PUMP_BATCH = 4


@dataclass(frozen=True)
class LoadConfig:
    """One run of the generator."""

    target: str
    rate_rps: float
    duration_s: float
    poisson: bool = False
    seed: int | None = 1
    tiers: tuple[Tier, ...] = DEFAULT_TIERS
    max_inflight: int = 8192
    max_lag_s: float = 0.5
    grace_s: float = 0.05
    method: str = "GET"
    keep_records: bool = False
    #: ``lean`` (HTTP/1.1 on asyncio protocols) or ``aiohttp``.
    client: str = "lean"
    #: Keep-alive connections the lean client opens before the first send.
    warm_connections: int = 0
    #: Freeze and pause the cyclic GC while offering (see the module docstring).
    pause_gc: bool = True

    def __post_init__(self) -> None:
        if self.client not in CLIENTS:
            raise ValueError(f"client must be one of {', '.join(CLIENTS)}, got {self.client!r}")
        if not 0 <= self.warm_connections <= self.max_inflight:
            raise ValueError("warm_connections must be between 0 and max_inflight")


@dataclass
class RunResult:
    """Everything a report needs from one run."""

    config: LoadConfig
    stats: RunStats
    scheduled: int
    wall_s: float
    cpu_s: float
    started_unix_s: float
    records: list[Record] | None = field(default=None, repr=False)
    #: Collections forced by ``GC_GUARD_OBJECTS`` while the collector was paused.
    gc_collections: int = 0

    @property
    def cpu_us_per_request(self) -> float:
        """Generator CPU per issued request, in microseconds."""
        sent = sum(t.sent for t in self.stats.tally)
        return self.cpu_s / sent * 1e6 if sent else math.nan


class LoadRunner:
    """Runs one ``LoadConfig``; ``stats`` is live during the run."""

    def __init__(self, config: LoadConfig, schedule: Schedule | None = None) -> None:
        self.config = config
        self.schedule = schedule or build_schedule(
            config.rate_rps,
            config.duration_s,
            random.Random(config.seed),
            poisson=config.poisson,
            tiers=config.tiers,
        )
        self.stats = RunStats(self.schedule.tiers)
        self.records: list[Record] | None = [] if config.keep_records else None
        self.inflight = 0
        self.elapsed_s = 0.0
        self._t0 = 0.0
        self._lags = [0.0] * len(self.schedule)
        self._offering = False
        self._next = 0  # the next request of the schedule to issue
        self._in_pump = False
        self._gc = _GcPause(False)
        self._drained: asyncio.Event | None = None
        self._client: _Client = (
            _LeanClient(config, self.schedule.tiers, self._finish)
            if config.client == "lean"
            else _AiohttpClient(config, self.schedule.tiers, self._finish)
        )

    async def run(self) -> RunResult:
        """Offer the whole schedule, wait for the stragglers, return the result."""
        self._drained = asyncio.Event()
        started_unix, cpu0, wall0 = time.time(), time.process_time(), time.perf_counter()
        await self._client.open()
        try:
            await self._client.warm(self.config.warm_connections)
            with _GcPause(self.config.pause_gc) as pause:
                await self._offer(pause)
                self._offering = False
                if self.inflight:
                    await self._drained.wait()
            self.elapsed_s = time.monotonic() - self._t0
        finally:
            await self._client.close()
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
        return RunResult(
            self.config, self.stats, len(self.schedule), wall_s, cpu_s, started_unix,
            self.records, pause.forced,
        )  # fmt: skip

    async def _offer(self, pause: _GcPause) -> None:
        clock = time.monotonic  # ns resolution; uvloop's loop.time() is in whole ms
        self._t0 = t0 = clock() + START_DELAY_S
        self._offering, self._gc = True, pause
        offsets, n = self.schedule.offsets_s, len(self.schedule)
        while self._next < n:
            due = t0 + offsets[self._next]
            now = clock()
            if now < due:
                await asyncio.sleep(due - now + TIMER_SLACK_S)
                continue
            behind = now - due > BEHIND_S
            self._pump(now, 1 if behind else PUMP_BATCH)
            if behind:
                await asyncio.sleep(0)  # catch up one request per loop turn (plus the pumps)

    def _pump(self, now: float, limit: int) -> None:
        """Issue the requests due by ``now``, at most ``limit`` of them.

        Called by the sending coroutine when it wakes and by ``_finish`` after
        every completion: in a burst of responses (the target's loop was
        stalled, then answered hundreds at once) the event loop runs every
        response callback before the coroutine's timer, so without the pump
        the sends due meanwhile would wait for the whole burst.
        """
        if self._in_pump:
            return
        self._in_pump = True
        t0, offsets, i = self._t0, self.schedule.offsets_s, self._next
        stop = min(len(offsets), i + limit)
        try:
            while i < stop and t0 + offsets[i] <= now:
                self._next = i + 1
                self._issue(i, now - t0 - offsets[i])
                i += 1
                now = time.monotonic()
        finally:
            self._in_pump = False
        self.elapsed_s = now - t0

    def _issue(self, i: int, lag: float) -> None:
        """Send request ``i`` now, ``lag`` seconds after its intended time, or skip it."""
        cfg, tier_id = self.config, self.schedule.tier_ids[i]
        tier, offset = self.schedule.tiers[tier_id], self.schedule.offsets_s[i]
        if lag > cfg.max_lag_s or lag >= tier.deadline_s:
            self._skip(tier_id, offset, lag, "behind")
        elif self.inflight >= cfg.max_inflight:
            self._skip(tier_id, offset, lag, "inflight_cap")
        else:
            self.inflight += 1
            self._lags[i] = lag
            self.stats.issued(tier_id, offset, lag)
            self._client.send(i, tier_id, tier.deadline_s - lag)
            self._gc.guard()  # once per issued request, whoever issued it

    def _skip(self, tier_id: int, offset: float, lag: float, why: str) -> None:
        self.stats.not_issued(tier_id, offset, why)
        if self.records is not None:
            name = self.schedule.tiers[tier_id].name
            rec = Record(name, offset, lag, math.nan, 0, Outcome.NOT_ISSUED, why)
            self.records.append(rec)

    def _finish(self, i: int, status: int, reason: str | None, detail: str) -> None:
        """The client's callback: request ``i`` of the schedule ended."""
        self.inflight -= 1
        offset, tier_id, lag = self.schedule.offsets_s[i], self.schedule.tier_ids[i], self._lags[i]
        end = time.monotonic()
        latency = end - (self._t0 + offset)
        tier = self.schedule.tiers[tier_id]
        if detail == "timeout":
            outcome = Outcome.EXPIRED
        elif detail:
            outcome = Outcome.ERROR
        else:
            outcome, detail = classify(status, reason, latency, tier.deadline_s)
        self.stats.completed(tier_id, end - self._t0, latency, outcome, detail)
        if self.records is not None:
            rec = Record(tier.name, offset, lag, latency, status, outcome, detail)
            self.records.append(rec)
        if self._offering:
            self._pump(end, PUMP_BATCH)
        elif not self.inflight and self._drained is not None:
            self._drained.set()


class _GcPause:
    """Freeze and pause the cyclic GC for a block (a no-op when disabled)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.was_enabled = gc.isenabled()
        self.forced = 0

    def __enter__(self) -> _GcPause:
        if self.enabled:
            gc.collect()
            gc.freeze()
            gc.disable()
        return self

    def guard(self) -> None:
        """Collect anyway once the tracked objects outgrow ``GC_GUARD_OBJECTS``."""
        if self.enabled and gc.get_count()[0] > GC_GUARD_OBJECTS:
            gc.collect()
            self.forced += 1

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            gc.unfreeze()
            if self.was_enabled:
                gc.enable()


class _Client(Protocol):
    """Sends request ``i`` with ``budget_s`` left and calls ``finish(i, ...)`` once."""

    async def open(self) -> None: ...
    async def warm(self, n: int) -> None: ...
    def send(self, i: int, tier_id: int, budget_s: float) -> None: ...
    async def close(self) -> None: ...


def _with_path(target: str, path: str) -> str:
    """``target`` with a tier's ``path`` appended to its path (``target`` when empty)."""
    if not path:
        return target
    head, sep, query = target.partition("?")
    return head.rstrip("/") + path + (sep + query if sep else "")


def _deadline_header(budget_s: float) -> bytes:
    return b"X-Deadline-Ms: %d\r\n\r\n" % int(budget_s * 1000.0)


class _LeanClient:
    """The lean HTTP/1.1 client (``loadgen/lean.py``)."""

    def __init__(self, config: LoadConfig, tiers: tuple[Tier, ...], finish: Finish) -> None:
        self.host, self.port, _ = request_prefix(config.target, config.method)
        self.heads = [
            request_prefix(_with_path(config.target, t.path), config.method)[2]
            + b"X-Priority: %s\r\n" % t.priority_header.encode()
            for t in tiers
        ]
        self.grace_s, self.finish = config.grace_s, finish
        self.pool: LeanPool | None = None

    async def open(self) -> None:
        self.pool = LeanPool(self.host, self.port, self.finish)

    async def warm(self, n: int) -> None:
        assert self.pool is not None
        await self.pool.warm(n)

    def send(self, i: int, tier_id: int, budget_s: float) -> None:
        assert self.pool is not None
        data = self.heads[tier_id] + _deadline_header(budget_s)
        self.pool.send(i, data, budget_s + self.grace_s)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()


class _AiohttpClient:
    """One aiohttp session; a task per request."""

    def __init__(self, config: LoadConfig, tiers: tuple[Tier, ...], finish: Finish) -> None:
        self.config, self.finish = config, finish
        self.urls = [URL(_with_path(config.target, t.path)) for t in tiers]
        self.names = [t.priority_header for t in tiers]
        self.tasks: set[asyncio.Task[None]] = set()
        self.session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.config.max_inflight, limit_per_host=0)
        self.session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )

    async def warm(self, n: int) -> None:
        """aiohttp opens its connections on demand; nothing to warm."""

    def send(self, i: int, tier_id: int, budget_s: float) -> None:
        task = asyncio.get_running_loop().create_task(self._one(i, tier_id, budget_s))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _one(self, i: int, tier_id: int, budget_s: float) -> None:
        assert self.session is not None
        headers = {"X-Priority": self.names[tier_id], "X-Deadline-Ms": str(int(budget_s * 1e3))}
        status, reason, detail = 0, None, ""
        try:
            async with asyncio.timeout(budget_s + self.config.grace_s):
                async with self.session.request(
                    self.config.method, self.urls[tier_id], headers=headers
                ) as r:
                    status, reason = r.status, r.headers.get("X-Ballast-Reason")
                    await r.read()
        except TimeoutError:
            detail = "timeout"
        except (aiohttp.ClientError, OSError) as exc:
            detail = type(exc).__name__
        self.finish(i, status, reason, detail)

    async def close(self) -> None:
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()


async def run_load(config: LoadConfig) -> RunResult:
    """Run ``config`` on the current event loop."""
    return await LoadRunner(config).run()
