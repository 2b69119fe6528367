"""A discrete-event model of generator -> gateway -> simulator, in simulated time.

It drives the gateway's own pure cores (``Limiter``, the limit algorithms,
``PriorityQueue`` + ``dispatch``) and the simulator's own backend model
(``ballast_tools.upstream_sim.model.Simulator``) with a simulated clock, so a
24 s scenario runs in well under a second of CPU and several controllers can
be compared on the same schedule. What it models, as the real stack does it:

* open-loop arrivals from ``loadgen``'s own schedule (constant, seeded tiers);
* the queue stage: a free permit is taken at once, else the request queues
  (per-tier bounds, displacement, LIFO tail) and is shed at its deadline;
* the proxy bounds an attempt by the request's deadline: at the deadline the
  client gets 504 and the permit is released as DROPPED, **but the backend
  keeps the request** (uvicorn does not cancel the app on disconnect), so it
  still occupies the backend queue and a worker;
* a success is released with the time to the response head as its RTT.

What it does not model by default: CPU time of the gateway and the generator
(event-loop lag). ``GatewayCpu`` (``--gateway-us``) adds a crude one: the
gateway is one event loop that spends a fixed CPU time per arrival, per
forwarded request, per relayed response and per shed/expired request, in FIFO
order, so its backlog is the event-loop lag, and that lag is inside every RTT
the limiter measures. The generator stays free. As in the gateway, a tick
every 5 ms on that loop measures its lag (``core.loop_lag``) and the limiter
hands it to the algorithm with each sample (ADR 0010); a limiter name ending
in ``-blind`` (``gradient-blind``) runs without it, as before ADR 0010. It is for iterating on
controllers; the published tables come from the real-time ``make experiment``.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ballast_asgi.core.limit import LimitAlgorithm, make_limit
from ballast_asgi.core.limit.base import (
    DEFAULT_INITIAL_LIMIT,
    DEFAULT_MAX_LIMIT,
    DEFAULT_MIN_LIMIT,
    DEFAULT_WINDOW_MS,
)
from ballast_asgi.core.limiter import DEFAULT_QUIET_LIMIT, Limiter, Permit
from ballast_asgi.core.loop_lag import LoopLag
from ballast_asgi.core.outcome import Outcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.queue import PriorityQueue, Waiter, dispatch
from ballast_tools.loadgen.schedule import build_schedule, make_tiers
from ballast_tools.upstream_sim.model import PathClass, Profile, Service, Simulator
from experiments.sweep.plan import (
    BURST,
    DEADLINES_S,
    FAST_MS,
    HETERO_CLASSES,
    MIX,
    QUIET_RPS,
    QUIET_S,
    SLOW_MS,
    RunSpec,
    parse_limiter,
)

#: One-way transport + event-loop time per hop (fixed part, and the mean of an
#: exponential extra drawn per hop).
HOP_S, HOP_JITTER_S = 0.0005, 0.0005
#: ``gradient-v1``: the gradient controller with the 2026-12-01 additions
#: switched off (no slow start, no shrink while not binding, cut at the floor);
#: ``gradient-q1.5``: 1.5 in binding windows too, as before ADR 0012.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "gradient-v1": (
        "gradient",
        {"slow_start_tolerance": 0, "shrink_headroom": 0, "queue_tolerance": 1.0},
    ),
    "gradient-q1.5": ("gradient", {"queue_tolerance_binding": 1.5}),
    # ADR 0016: one floor for every route, shrinking to the peak when quiet (today's rule)
    "gradient-one": ("gradient", {"route_baselines": False, "quiet_limit": 4}),
    # ADR 0016 candidates: per-route floors without the quiet floor; a higher start
    "gradient-routes-only": ("gradient", {"quiet_limit": 4}),
    "gradient-i64": ("gradient", {"initial_limit": 64}),
    "gradient-one-i64": ("gradient", {"route_baselines": False, "initial_limit": 64}),
}
#: A limiter name ending in ``-part`` gets one limit per route (``Limiter(partition=...)``).
PART_SUFFIX = "-part"
#: An ``asyncio.sleep(t)`` lasts about this much longer than ``t`` (measured
#: capacity 264 rps against the model's 269).
SLEEP_OVERSHOOT_S = 0.0006


@dataclass(frozen=True)
class GatewayCpu:
    """CPU seconds the gateway's one event loop spends per event (all 0: free)."""

    arrive_s: float = 0.0
    forward_s: float = 0.0
    response_s: float = 0.0
    shed_s: float = 0.0

    @classmethod
    def parse(cls, text: str) -> GatewayCpu:
        """``"80,90,100,40"``: microseconds per arrival, forward, response, shed."""
        parts = [float(x) / 1e6 for x in text.split(",")]
        if len(parts) != 4 or min(parts) < 0:
            raise ValueError(f"--gateway-us wants four non-negative numbers, got {text!r}")
        return cls(*parts)


@dataclass(eq=False)
class Req:
    """One request's life."""

    intended: float
    tier: int
    deadline: float
    done_at: float | None = None
    status: str = ""
    permit: Permit | None = None
    waiter: Waiter | None = None
    #: Path class index (-1: the default pool) and its route key.
    cls: int = -1
    route: str = ""


@dataclass
class Clock:
    """Simulated time and the event heap."""

    now: float = 0.0
    heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = field(
        default_factory=list
    )
    seq: itertools.count[int] = field(default_factory=itertools.count)

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), fn, args))

    def run(self) -> None:
        while self.heap:
            t, _, fn, args = heapq.heappop(self.heap)
            self.now = t
            fn(*args)


class Model:
    """Gateway (queue + limiter) in front of the simulator's backend model."""

    def __init__(
        self,
        spec: RunSpec,
        algo_params: dict[str, Any] | None = None,
        cpu: GatewayCpu | None = None,
    ) -> None:
        self.spec = spec
        self.clock = Clock()
        self.cpu = cpu or GatewayCpu()
        #: When the gateway's event loop is next free (its backlog is the loop lag).
        self.loop_free = 0.0
        name, fixed = parse_limiter(spec.limiter)
        part = name.endswith(PART_SUFFIX)
        name = name.removesuffix(PART_SUFFIX)
        blind = name.endswith("-blind")
        name = name.removesuffix("-blind")
        name, params = VARIANTS.get(name, (name, {}))
        params = {**params, **(algo_params or {})}
        rng = random.Random(spec.seed)

        def build(quiet: bool = False) -> LimitAlgorithm:
            if fixed is not None:
                return make_limit("fixed", limit=fixed)
            kw = {"initial_limit": DEFAULT_QUIET_LIMIT if quiet else DEFAULT_INITIAL_LIMIT,
                  **params}  # fmt: skip
            return make_limit(name, min_limit=DEFAULT_MIN_LIMIT, max_limit=DEFAULT_MAX_LIMIT,
                              window_ms=DEFAULT_WINDOW_MS, rng=rng, **kw)  # fmt: skip

        self.lag = LoopLag()
        lag_source = None if blind else (lambda: self.lag.estimate(self.clock.now))
        self.limiter = Limiter(build(), max_limit=DEFAULT_MAX_LIMIT, loop_lag=lag_source,
                               partition=build if part else None)  # fmt: skip
        self.queue = PriorityQueue()  # the gateway's defaults
        self.limiter.set_on_release(self._dispatch)
        paths: tuple[PathClass, ...] = ()
        if spec.scenario in ("hetero", "quiet"):
            slow_workers = BURST if spec.scenario == "quiet" else None
            paths = tuple(PathClass(p, slow_workers if slow_workers and ms >= 1000 else w,
                                    ms * spec.k / 1e3)
                          for p, ms, _, w, _ in HETERO_CLASSES)  # fmt: skip
        profile = Profile(spec.workers, FAST_MS * spec.k / 1e3, SLOW_MS * spec.k / 1e3, paths=paths)
        self.sim: Simulator[Req] = Simulator(profile, random.Random(spec.seed))
        self.hop_rng = random.Random(spec.seed + 1)
        self.reqs: list[Req] = []
        self.limits: list[tuple[float, int]] = []

    # -- driving --------------------------------------------------------------
    def _arrivals(self) -> list[Req]:
        spec = self.spec
        tiers = make_tiers(MIX, [d * spec.k for d in DEADLINES_S])
        if spec.scenario == "quiet":  # a quiet spell of fast requests, then a burst of slow
            fast = [Req(i / QUIET_RPS, 1, i / QUIET_RPS + 1.0, cls=0, route="/fast")
                    for i in range(int(QUIET_S * QUIET_RPS))]  # fmt: skip
            burst = [Req(QUIET_S, 1, QUIET_S + 30.0, cls=2, route="/slow") for _ in range(BURST)]
            return fast + burst
        rng = random.Random(spec.seed)
        sched = build_schedule(spec.rate_rps, spec.duration_s, rng, tiers=tiers)
        out = []
        shares = [share for _, _, share, _, _ in HETERO_CLASSES]
        for off, tid in zip(sched.offsets_s, sched.tier_ids, strict=True):
            if spec.scenario == "hetero":
                cls = rng.choices(range(len(shares)), weights=shares)[0]
                prefix, _, _, _, deadline_s = HETERO_CLASSES[cls]
                out.append(Req(off, tid, off + deadline_s * spec.k, cls=cls, route=prefix))
            else:
                out.append(Req(off, tid, off + tiers[tid].deadline_s))
        return out

    def run(self) -> list[Req]:
        spec, c = self.spec, self.clock
        for req in self._arrivals():
            self.reqs.append(req)
            c.at(req.intended, self._on_loop, self.cpu.arrive_s, self._arrive, req)
        for at_s, update in spec.events:
            c.at(at_s, self._profile, update)
        t = 0.0
        while t < spec.duration_s:
            c.at(t, self._sample_limit)
            t += 0.1
        self.ticks_until = max(r.deadline for r in self.reqs) if self.reqs else 0.0
        c.at(0.0, self._tick)
        c.run()
        return self.reqs

    def _on_loop(self, cost_s: float, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` once the event loop has spent ``cost_s`` on it (FIFO); at once if free."""
        now = self.clock.now
        if cost_s <= 0 and self.loop_free <= now:
            fn(*args)
            return
        self.loop_free = max(now, self.loop_free) + cost_s
        self.clock.at(self.loop_free, fn, *args)

    def _tick(self) -> None:
        """The gateway's lag tick: due ``period_s`` after the last one ran, run in loop order."""
        now = self.clock.now
        self.lag.tick(now)
        if now < self.ticks_until:
            self.clock.at(now + self.lag.period_s, self._on_loop, 0.0, self._tick)

    def _charge(self, cost_s: float) -> None:
        """The loop spends ``cost_s`` (a shed answer) without delaying the caller."""
        if cost_s > 0:
            self.loop_free = max(self.clock.now, self.loop_free) + cost_s

    def _hop(self) -> float:
        return HOP_S + self.hop_rng.expovariate(1.0 / HOP_JITTER_S)

    def _sample_limit(self) -> None:
        self.limits.append((self.clock.now, self.limiter.limit))

    def _profile(self, update: dict[str, Any]) -> None:
        prof = self.sim.profile
        fields = {f: getattr(prof, f) for f in ("workers", "fast_s", "slow_s", "slow_fraction",
                                                  "latency_multiplier")}  # fmt: skip
        fields.update(update)
        for req in self.sim.set_profile(Profile(**fields)):
            self._begin(req)

    # -- gateway --------------------------------------------------------------
    def _finish(self, req: Req, status: str) -> None:
        if req.done_at is None:
            req.done_at, req.status = self.clock.now + HOP_S, status
            if status != "ok":
                self._charge(self.cpu.shed_s)

    def _arrive(self, req: Req) -> None:
        now = self.clock.now
        if self.queue.total == 0 or self.limiter.partitioned:
            permit = self.limiter.try_acquire(now, req.route)
            if permit is not None:
                self._forward(req, permit)
                return
        waiter = Waiter(Priority(req.tier), now, deadline=req.deadline, handle=req, route=req.route)
        pushed = self.queue.push(waiter)
        if not pushed.accepted:
            self._finish(req, "queue_full")
            return
        if pushed.displaced is not None:
            self._finish(pushed.displaced.handle, "queue_full")
        req.waiter = waiter
        self.clock.at(req.deadline, self._expire, req)

    def _expire(self, req: Req) -> None:
        if req.waiter is not None and self.queue.remove(req.waiter):
            self._finish(req, "deadline")

    def _dispatch(self, now: float) -> None:
        dispatch(self.queue, self.limiter, now, self._deliver)

    def _deliver(self, waiter: Waiter, permit: Permit) -> bool:
        req: Req = waiter.handle
        if req.done_at is not None or self.clock.now >= req.deadline:
            return False
        self._forward(req, permit)
        return True

    def _forward(self, req: Req, permit: Permit) -> None:
        req.permit = permit
        permit.route = req.route
        self.clock.at(req.deadline, self._timeout, req)
        self._on_loop(self.cpu.forward_s, self._send, req)

    def _send(self, req: Req) -> None:
        self.clock.at(self.clock.now + self._hop(), self._backend_arrive, req)

    def _timeout(self, req: Req) -> None:
        permit = req.permit
        if permit is not None and not permit.released and req.done_at is None:
            self._finish(req, "timeout")
            permit.release(Outcome.DROPPED, self.clock.now)

    # -- backend --------------------------------------------------------------
    def _backend_arrive(self, req: Req) -> None:
        if self.sim.arrive(req, req.cls):
            self._begin(req)

    def _begin(self, req: Req) -> None:
        now = self.clock.now
        service = self.sim.begin(now, req.deadline, now, req.cls)
        self.clock.at(now + service.duration_s + SLEEP_OVERSHOOT_S, self._end, req, service)

    def _end(self, req: Req, service: Service) -> None:
        now = self.clock.now
        nxt = self.sim.end(service, req.deadline, now, req.cls)
        if nxt is not None:
            self._begin(nxt)
        self.clock.at(now + self._hop(), self._on_loop, self.cpu.response_s, self._response, req)

    def _response(self, req: Req) -> None:
        permit = req.permit
        if permit is None or permit.released:
            return
        self._finish(req, "ok")
        now = self.clock.now
        permit.release(Outcome.SUCCESS, now, now - permit.start)


def summarize(model: Model, reqs: list[Req]) -> dict[str, Any]:
    """The experiment's headline numbers for one run."""
    crit = [r for r in reqs if r.tier == 0]
    lat = sorted((r.done_at or 0) - r.intended for r in crit if r.done_at is not None)
    p99 = lat[int(0.99 * (len(lat) - 1))] * 1e3 / model.spec.k if lat else None
    third = model.spec.duration_s / 3
    per = [sum(1 for r in reqs if r.status == "ok" and i * third <= r.intended < (i + 1) * third)
           for i in range(3)]  # fmt: skip
    lims = [lim for _, lim in model.limits]
    return {
        "critical_served": sum(1 for r in crit if r.status == "ok"),
        "critical_sent": len(crit),
        "critical_p99_ms": p99,
        "served_total": sum(1 for r in reqs if r.status == "ok"),
        "served_thirds": per,
        "limit_min": min(lims),
        "limit_max": max(lims),
    }


def summarize_classes(model: Model, reqs: list[Req]) -> dict[str, Any]:
    """Per endpoint class: served, sent, p99 ms of the served, critical served share."""
    out: dict[str, Any] = {}
    for cls, (prefix, *_rest) in enumerate(HETERO_CLASSES):
        mine = [r for r in reqs if r.cls == cls]
        ok = sorted((r.done_at or 0) - r.intended for r in mine if r.status == "ok")
        crit = [r for r in mine if r.tier == 0]
        out[prefix] = {
            "served": len(ok),
            "sent": len(mine),
            "p99_ms": ok[int(0.99 * (len(ok) - 1))] * 1e3 / model.spec.k if ok else None,
            "critical_share": sum(r.status == "ok" for r in crit) / max(1, len(crit)),
        }
    return out


def burst_makespan(model: Model, reqs: list[Req]) -> float | None:
    """Seconds from the burst to its last slow answer (None: one was not served)."""
    burst = [r for r in reqs if r.cls == 2]
    if not burst or any(r.status != "ok" for r in burst):
        return None
    return max(r.done_at or 0.0 for r in burst) - QUIET_S
