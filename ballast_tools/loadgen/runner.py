"""The open-loop runner: aiohttp on the running loop (uvloop from the CLI).

One task walks the schedule and starts one request task at each intended time
``t0 + offset`` whether or not earlier requests returned (open loop: the
target cannot slow the offered load down). For each request:

- ``lag = issue_time - intended_time`` (>= 0; the loop sleeps until a request is
  due and never sends early). Lag is recorded, counts as latency (latency is
  ``completion - intended``, so there is no coordinated omission), and is
  taken off the budget sent in ``X-Deadline-Ms = deadline - lag``.
- A request is *not issued* when ``lag > max_lag_s`` or ``lag >= deadline``
  (``behind``), or when ``max_inflight`` requests are already out
  (``inflight_cap``); it is counted apart, never silently dropped.
- The client gives up at ``deadline - lag + grace_s`` (cancels the request and
  closes its connection) so late requests do not pile up.

The runner reports its own schedule-lag percentiles and CPU time
(``time.process_time``) so a reader can tell when the generator, not the
target, was the bottleneck. ``LoadRunner.stats`` can be read while the run is
in progress (the demo's live view does).
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from ballast_tools.loadgen.record import Outcome, Record, RunStats, classify
from ballast_tools.loadgen.schedule import DEFAULT_TIERS, Schedule, Tier, build_schedule

START_DELAY_S = 0.05
#: uvloop rounds timer delays to whole milliseconds against a cached loop time,
#: so a sleep can end up to ~1 ms early; sleeping this much longer (and
#: re-checking a precise clock) means a request is never sent before its time.
TIMER_SLACK_S = 0.0005
#: When this far behind, yield to the loop after each request: a backlog issued
#: in one burst would find every pooled connection busy and open hundreds of new
#: ones, costing more CPU per request and falling further behind.
BEHIND_S = 0.002


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
        self._url = URL(config.target)
        self._t0 = 0.0
        self._headers = [{"X-Priority": t.name} for t in self.schedule.tiers]

    async def run(self) -> RunResult:
        """Offer the whole schedule, wait for the stragglers, return the result."""
        connector = aiohttp.TCPConnector(limit=self.config.max_inflight, limit_per_host=0)
        session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
        )
        started_unix, cpu0, wall0 = time.time(), time.process_time(), time.perf_counter()
        try:
            await self._offer(session)
        finally:
            await session.close()
        cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
        return RunResult(
            self.config, self.stats, len(self.schedule), wall_s, cpu_s, started_unix, self.records
        )

    async def _offer(self, session: aiohttp.ClientSession) -> None:
        loop = asyncio.get_running_loop()
        clock = time.monotonic  # ns resolution; uvloop's loop.time() is in whole ms
        self._t0 = t0 = clock() + START_DELAY_S
        tasks: set[asyncio.Task[None]] = set()
        tiers, cfg = self.schedule.tiers, self.config
        for offset, tier_id in zip(self.schedule.offsets_s, self.schedule.tier_ids, strict=True):
            due = t0 + offset
            now = clock()
            while now < due:
                await asyncio.sleep(due - now + TIMER_SLACK_S)
                now = clock()
            self.elapsed_s = now - t0
            lag = now - due
            if lag > cfg.max_lag_s or lag >= tiers[tier_id].deadline_s:
                self._skip(tier_id, offset, lag, "behind")
            elif self.inflight >= cfg.max_inflight:
                self._skip(tier_id, offset, lag, "inflight_cap")
            else:
                self.inflight += 1
                self.stats.issued(tier_id, offset, lag)
                task = loop.create_task(self._one(session, tier_id, offset, due, lag))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                if lag > BEHIND_S:
                    await asyncio.sleep(0)  # catch up one request per loop turn
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self.elapsed_s = clock() - t0

    def _skip(self, tier_id: int, offset: float, lag: float, why: str) -> None:
        self.stats.not_issued(tier_id, offset, why)
        if self.records is not None:
            name = self.schedule.tiers[tier_id].name
            rec = Record(name, offset, lag, math.nan, 0, Outcome.NOT_ISSUED, why)
            self.records.append(rec)

    async def _one(
        self, session: aiohttp.ClientSession, tier_id: int, offset: float, due: float, lag: float
    ) -> None:
        tier = self.schedule.tiers[tier_id]
        budget_s = tier.deadline_s - lag
        headers = dict(self._headers[tier_id])
        headers["X-Deadline-Ms"] = str(int(budget_s * 1000.0))
        status, reason, detail = 0, None, ""
        try:
            async with asyncio.timeout(budget_s + self.config.grace_s):
                async with session.request(self.config.method, self._url, headers=headers) as r:
                    status, reason = r.status, r.headers.get("X-Ballast-Reason")
                    await r.read()
        except TimeoutError:
            detail = "timeout"
        except (aiohttp.ClientError, OSError) as exc:
            detail = type(exc).__name__
        finally:
            self.inflight -= 1
        self._done(tier_id, offset, due, lag, status, reason, detail)

    def _done(
        self,
        tier_id: int,
        offset: float,
        due: float,
        lag: float,
        status: int,
        reason: str | None,
        detail: str,
    ) -> None:
        end = time.monotonic()
        latency = end - due
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


async def run_load(config: LoadConfig) -> RunResult:
    """Run ``config`` on the current event loop."""
    return await LoadRunner(config).run()
