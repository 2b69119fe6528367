"""The gradient controller: the default adaptive concurrency limit.

It looks for the concurrency at the knee of the throughput curve by comparing
recent round-trip times with the no-load round-trip time (Little's law read
backwards). The full description, with the measurements behind each rule, is
``docs/controller.md``; in short:

* **Windows** of ``window_ms`` (>= ``min_window_samples`` successes). Per window,
  ``ratio = rtt_noload / rtt_recent`` (``rtt_percentile`` of the window),
  ``new = limit * clamp(queue_tolerance * ratio, min_gradient, 1) + sqrt(limit)``
  (``queue_tolerance_binding`` in a binding window).
  Growth only when the window was binding (>= 25 % of its samples started at
  ``binding_ratio`` of the limit in force *when they started*); a window that
  was not binding brings the limit down to ``peak in-flight * shrink_headroom
  + sqrt(peak)`` (so a capacity drop does not start from a height); a window
  at the floor multiplies by ``growth_factor`` unless slow start already grew;
  the first window (no floor measured yet) never grows (ADR 0012).
* **Slow start**: between windows, a success that started at the limit and
  took at most ``slow_start_tolerance * rtt_noload`` adds ``slow_start_step``
  at once (0.5: the limit grows at most x1.5 per round trip; a capacity step is
  found in a few round trips, not windows).
* **Fast close**: a window closes early once ``fast_close_samples`` requests
  that started in it finished and most took over ``fast_close_ratio`` x the floor.
* **Drops** (timeout, 5xx, deadline) multiply by ``backoff_ratio`` at most once
  per window and forbid growth in it; a drop that came sooner than the no-load
  RTT (a request dispatched with almost no deadline left) says nothing about
  the backend and is ignored.
* **Probes** re-measure ``rtt_noload`` at ``probe_limit``: after a binding first
  window, every ``probe_interval_s`` (+/- jitter, injected ``random.Random``)
  and when ``stuck_windows`` windows in a row had ``queue_tolerance * ratio <
  stuck_ratio`` without recovering (the backend got slower); a probe that finds
  the floor moved more than ``1 / stuck_ratio`` x restores the limit from
  before the streak.

* **Routes** (``route_baselines``, ADR 0016): each sample is judged against
  its own route's no-load RTT (``route_floors.RouteFloors``), so the mix of
  fast and slow endpoints is not read as queueing; the floor is then 1.0 and
  the periodic probe is replaced by a refresh from non-binding windows (no
  probe dip). A window that did not bind never shrinks the limit below
  ``quiet_limit`` (default: the initial limit): a quiet spell is not evidence.

Parameters are keyword arguments with the defaults below (the new ones as
module constants). References: Netflix concurrency-limits
``GradientLimit``/``Gradient2Limit``, Envoy adaptive concurrency (minRTT
probes), TCP slow start.

Longer than 320 lines because the controller is one state machine: the window
rules, slow start, the stuck count and the probes all read and move the same
limit, floor and window state (a probe saves the limit that its end restores, a
drop during a probe cuts the saved limit, a window's close starts a probe, a
sample that started under the probe's limit is kept out of the next window),
so each rule reads right only beside the others; split by rule, every part
would need the whole class to be followed. What is apart already is apart: the
sample and bounds (``base.py``), the per-route floors (``route_floors.py``).
"""

from __future__ import annotations

import math
import random

from ballast_asgi.core.limit.base import (
    DEFAULT_INITIAL_LIMIT,
    DEFAULT_MAX_LIMIT,
    DEFAULT_MIN_LIMIT,
    DEFAULT_WINDOW_MS,
    MIN_RTT_S,
    Sample,
    check_bounds,
    clamp,
    unpacks_into_on_result,
)
from ballast_asgi.core.limit.route_floors import DEFAULT_MAX_ROUTES, RouteFloors, percentile
from ballast_asgi.core.native import mypyc_attr

#: Slow start: a success that started at the limit (``binding_ratio``) and took
#: at most this many times the no-load RTT raises the limit by ``slow_start_step``
#: at once (0 disables slow start). A step of 0.5 grows the limit at most x1.5 per
#: round trip: a step of 1 (doubling) overshot by a round trip's worth when the
#: round trip is long (a 5x slower backend, ``docs/controller.md``).
DEFAULT_SLOW_START_TOLERANCE = 1.2
DEFAULT_SLOW_START_STEP = 0.5
#: A window that was not binding brings the limit down to at most
#: ``peak in-flight * shrink_headroom + sqrt(peak)`` (0 disables shrinking).
DEFAULT_SHRINK_HEADROOM = 1.25
#: The window's gradient is ``clamp(queue_tolerance * rtt_noload / rtt_recent)``:
#: latency up to this factor above the floor is not cut for (1.0: the old rule).
DEFAULT_QUEUE_TOLERANCE = 1.5
#: The tolerance of a *binding* window (our own queue is non-empty): the backend
#: is the bottleneck, and every request queued there beyond a few delays the
#: critical tier behind bulk where our priority queue cannot reorder it
#: (ADR 0012). A window that did not reach the limit keeps ``queue_tolerance``:
#: its RTT is inflated by the gateway's own loop more than by a backend queue.
DEFAULT_QUEUE_TOLERANCE_BINDING = 1.25
#: The rest of the rules' constants (``docs/controller.md``; config keys
#: ``limiter.gradient.*``): the window's RTT percentile, the growth test and
#: factor, the cut on a drop, the largest cut per window, the stuck-probe ratio
#: and the probe period.
DEFAULT_RTT_PERCENTILE = 0.5
DEFAULT_TOLERANCE = 1.1
DEFAULT_GROWTH_FACTOR = 1.5
DEFAULT_BACKOFF_RATIO = 0.9
DEFAULT_MIN_GRADIENT = 0.25
DEFAULT_STUCK_RATIO = 0.5
DEFAULT_PROBE_INTERVAL_S = 30.0

_MAX_WINDOW_SAMPLES = 10_000
#: A stuck streak continues only while the ratio improves by less than this factor.
_RECOVERING = 1.1
#: A window is binding when at least this share of its samples started at the limit.
_BINDING_SHARE = 0.25


@mypyc_attr(allow_interpreted_subclasses=True)
class GradientLimit:
    """Windowed RTT-gradient controller with multiplicative growth and minRTT probes."""

    name = "gradient"

    def __init__(
        self,
        *,
        initial_limit: int = DEFAULT_INITIAL_LIMIT,
        min_limit: int = DEFAULT_MIN_LIMIT,
        max_limit: int = DEFAULT_MAX_LIMIT,
        window_ms: float = DEFAULT_WINDOW_MS,
        min_window_samples: int = 5,
        rtt_percentile: float = DEFAULT_RTT_PERCENTILE,
        tolerance: float = DEFAULT_TOLERANCE,
        growth_factor: float = DEFAULT_GROWTH_FACTOR,
        binding_ratio: float = 0.9,
        backoff_ratio: float = DEFAULT_BACKOFF_RATIO,
        min_gradient: float = DEFAULT_MIN_GRADIENT,
        stuck_ratio: float = DEFAULT_STUCK_RATIO,
        fast_close_ratio: float = 2.0,
        fast_close_samples: int = 20,
        probe_limit: int | None = None,
        probe_samples: int = 10,
        probe_max_windows: int = 4,
        probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
        probe_jitter: float = 0.1,
        stuck_windows: int = 2,
        slow_start_tolerance: float = DEFAULT_SLOW_START_TOLERANCE,
        slow_start_step: float = DEFAULT_SLOW_START_STEP,
        shrink_headroom: float = DEFAULT_SHRINK_HEADROOM,
        queue_tolerance: float = DEFAULT_QUEUE_TOLERANCE,
        queue_tolerance_binding: float = DEFAULT_QUEUE_TOLERANCE_BINDING,
        route_baselines: bool = True,
        max_routes: int = DEFAULT_MAX_ROUTES,
        quiet_limit: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        check_bounds(initial_limit, min_limit, max_limit)
        _check_params(window_ms, rtt_percentile, tolerance, growth_factor, backoff_ratio)
        self.min_limit, self.max_limit = min_limit, max_limit
        self.window_s = window_ms / 1000.0
        self.min_window_samples = max(1, min_window_samples)
        self.rtt_percentile, self.tolerance = rtt_percentile, tolerance
        self.growth_factor, self.binding_ratio = growth_factor, binding_ratio
        self.backoff_ratio, self.min_gradient = backoff_ratio, min_gradient
        _check_more(min_gradient, stuck_ratio, fast_close_ratio, probe_interval_s)
        self.stuck_ratio = stuck_ratio
        self.fast_close_ratio, self.fast_close_samples = fast_close_ratio, fast_close_samples
        self.probe_limit = int(clamp(probe_limit or min_limit, min_limit, max_limit))
        self.probe_samples, self.probe_max_windows = max(1, probe_samples), probe_max_windows
        self.probe_interval_s, self.probe_jitter = probe_interval_s, probe_jitter
        self.stuck_windows = stuck_windows
        if slow_start_tolerance < 0 or slow_start_step < 0:
            raise ValueError("slow_start_tolerance and slow_start_step must be >= 0")
        self.slow_start_tolerance, self.slow_start_step = slow_start_tolerance, slow_start_step
        if shrink_headroom and shrink_headroom < 1.0:
            raise ValueError(f"shrink_headroom must be 0 (off) or >= 1, got {shrink_headroom}")
        self.shrink_headroom = shrink_headroom
        for key, value in (("queue_tolerance", queue_tolerance),
                           ("queue_tolerance_binding", queue_tolerance_binding)):  # fmt: skip
            if value < 1.0:
                raise ValueError(f"{key} must be >= 1.0, got {value}")
        self.queue_tolerance = queue_tolerance
        self.queue_tolerance_binding = queue_tolerance_binding
        #: Per-route floors (None: one floor for every sample, before ADR 0016).
        self.routes = (
            RouteFloors(max_routes=max_routes, refresh_s=probe_interval_s,
                        percentile=rtt_percentile)
            if route_baselines else None
        )  # fmt: skip
        self.quiet_limit = float(clamp(quiet_limit or initial_limit, min_limit, max_limit))
        self._route_key = ""
        #: Limit added by slow start since the last window closed.
        self._slow_started = 0.0
        self._rng = rng or random.Random(0)
        self._limit = float(initial_limit)
        #: With routes, RTTs are relative to each route's floor: the floor is 1.0.
        self._rtt_noload_s: float | None = 1.0 if self.routes is not None else None
        self._rtt_recent_s: float | None = None
        self._probed = False
        #: Completed probes that measured the no-load RTT.
        self.probes = 0
        #: Closed measurement windows.
        self.windows = 0
        self._stuck = 0
        self._last_ratio = 1.0
        self._pre_stuck_limit = self._limit
        self._probe_restore: float | None = None
        self._next_probe_at = math.inf
        self._probe_start: float | None = None
        self._probe_rtts: list[float] = []
        self._saved_limit = self._limit
        self._probe_ended_at = -math.inf
        self._probe_end_window = 0
        self._last_backoff_at = -math.inf
        self._reset_window(None)

    # -- public ---------------------------------------------------------------
    @property
    def limit(self) -> int:
        """The enforced limit (``probe_limit`` while probing)."""
        if self._probe_start is not None:
            return min(self.probe_limit, int(self._saved_limit))
        return int(self._limit)

    @property
    def probing(self) -> bool:
        """True while the no-load RTT is being re-measured."""
        return self._probe_start is not None

    @property
    def rtt_noload_s(self) -> float | None:
        """The current no-load RTT estimate (None before the first window)."""
        return self._rtt_noload_s

    @property
    def rtt_recent_s(self) -> float | None:
        """The last closed window's RTT percentile."""
        return self._rtt_recent_s

    def on_sample(self, sample: Sample, now: float) -> int:
        """Take one sample; close the window or finish a probe when due."""
        return self.on_result(
            sample.start, sample.rtt_s, sample.inflight_at_start, sample.dropped,
            sample.limit_at_start, sample.lag_s, sample.route, now,
        )  # fmt: skip

    def on_result(
        self,
        start: float,
        rtt_s: float,
        inflight_at_start: int,
        dropped: bool,
        limit_at_start: int,
        lag_s: float,
        route: str,
        now: float,
    ) -> int:
        """``on_sample`` with the sample's fields as arguments (no ``Sample`` is built).

        The hot path of every release (``Limiter``): the rules read the sample's
        start, its RTT (in units of its route's floor, ADR 0016) and the backend
        RTT (without the loop lag, floored at ``MIN_RTT_S``), computed once here.
        """
        if self._window_start is None:
            self._reset_window(now)
        rtt = rtt_s - lag_s
        backend = rtt if rtt > MIN_RTT_S else MIN_RTT_S
        routes = self.routes
        if routes is not None:  # the RTT in units of the route's floor (ADR 0016)
            key = self._route_key = routes.key(route)
            rtt_s = routes.relative(key, backend, not dropped)
            backend = rtt_s if rtt_s > MIN_RTT_S else MIN_RTT_S
        if dropped:
            self._on_drop(backend, now)
        elif self._probe_start is not None:
            self._probe_sample(start, inflight_at_start, backend, rtt_s)
        else:
            self._window_sample(start, inflight_at_start, limit_at_start, backend, rtt_s)
        if self._probe_start is not None:
            self._maybe_end_probe(now)
        else:  # ``_window_due`` is False unless fast-close may apply or the window has run
            window_start: float = self._window_start  # type: ignore[assignment]  # set above
            if (
                self._fresh >= self.fast_close_samples or not now - window_start < self.window_s
            ) and self._window_due(now):
                self._close_window(now)
        if self._probe_start is not None:  # ``limit``, without the property call
            return min(self.probe_limit, int(self._saved_limit))
        return int(self._limit)

    def _keep_route_rtt(self, rel_rtt: float) -> None:
        routes = self.routes
        if routes is not None:
            routes.record(self._route_key, rel_rtt * routes.floors[self._route_key])

    def snapshot(self) -> dict[str, object]:
        """State for ``/snapshot``."""
        routes = self.routes
        return {
            "route_baselines": routes.snapshot() if routes is not None else None,
            "quiet_limit": int(self.quiet_limit),
            "name": self.name,
            "limit": self.limit,
            "state": "probing" if self.probing else "measuring",
            "probes": self.probes,
            "windows": self.windows,
            "rtt_noload_s": self._rtt_noload_s,
            "rtt_recent_s": self._rtt_recent_s,
            "window_ms": self.window_s * 1000.0,
        }

    # -- sampling -------------------------------------------------------------
    def _reset_window(self, now: float | None) -> None:
        self._window_start = now
        self._window_rtts: list[float] = []
        self._window_binding = 0
        self._window_peak = 0
        self._window_dropped = False
        self._fresh = 0
        self._fresh_slow = 0

    def _window_sample(
        self, start: float, held: int, limit_at_start: int, backend: float, rtt: float
    ) -> None:
        """One success into the window (``backend``: its backend RTT; ``rtt``: unfloored)."""
        if start < self._probe_ended_at:
            return  # started under the probe's limit: says nothing about the restored one
        rtts = self._window_rtts
        if len(rtts) < _MAX_WINDOW_SAMPLES:
            rtts.append(backend)
            routes = self.routes
            if routes is not None:  # ``_keep_route_rtt``
                routes.record(self._route_key, rtt * routes.floors[self._route_key])
        window_start, noload = self._window_start, self._rtt_noload_s
        known = self._probed or self.routes is not None  # routes: a provisional floor at once
        if known and window_start is not None and noload is not None and start >= window_start:
            self._fresh += 1
            if backend > self.fast_close_ratio * noload:
                self._fresh_slow += 1
        if held > self._window_peak:
            self._window_peak = held
        # At the limit of its time (``Sample.started_at_limit``) and of today's (contract 3).
        limit = self._limit
        now_limit = int(limit)
        if limit_at_start:
            then = now_limit if now_limit < limit_at_start else limit_at_start
        else:
            then = now_limit
        if held >= self.binding_ratio * then and 2 * held >= limit:
            self._window_binding += 1
            self._slow_start(backend)

    def _slow_start(self, backend: float) -> None:
        """Grow at once on a success at the limit that did not queue (x1.5 per RTT at most)."""
        noload = self._rtt_noload_s
        if not self._probed or noload is None or self._window_dropped:
            return
        if backend <= self.slow_start_tolerance * noload:
            self._limit = min(self._limit + self.slow_start_step, float(self.max_limit))
            self._slow_started += self.slow_start_step

    def _on_drop(self, backend: float, now: float) -> None:
        noload = self._rtt_noload_s
        if noload is not None and backend < noload:
            return  # failed sooner than any answer could come: its deadline, not the backend
        self._window_dropped = True
        if now - self._last_backoff_at < self.window_s:
            return
        self._last_backoff_at = now
        if self._probe_start is not None:
            self._saved_limit = clamp(
                self._saved_limit * self.backoff_ratio, self.min_limit, self.max_limit
            )
        else:
            self._limit = clamp(self._limit * self.backoff_ratio, self.min_limit, self.max_limit)

    def _window_due(self, now: float) -> bool:
        start = self._window_start if self._window_start is not None else now
        if self._fresh >= self.fast_close_samples and 2 * self._fresh_slow > self._fresh:
            return True  # most requests started in this window queue: do not wait it out
        elapsed = now - start
        if elapsed < self.window_s or len(self._window_rtts) < self.min_window_samples:
            return False
        routes = self.routes  # a window spans two round trips of its slowest route (ADR 0016)
        return routes is None or not routes.floors or elapsed >= 2.0 * max(routes.floors.values())

    # -- the update -----------------------------------------------------------
    def _close_window(self, now: float) -> None:
        rtts, at_limit, dropped, peak = (
            self._window_rtts,
            self._window_binding,
            self._window_dropped,
            self._window_peak,
        )
        slow_started, self._slow_started = self._slow_started > 0, 0.0
        self._reset_window(now)
        self.windows += 1
        recent = percentile(rtts, self.rtt_percentile)
        self._rtt_recent_s = recent
        binding = at_limit >= max(1.0, _BINDING_SHARE * len(rtts))
        if self.routes is not None:  # the floor is 1.0: each route's own is in the table
            self.routes.close_window(binding, now)
        elif self._rtt_noload_s is None or recent < self._rtt_noload_s:
            self._rtt_noload_s = recent
        assert self._rtt_noload_s is not None
        ratio = self._rtt_noload_s / recent
        self._count_stuck(ratio)
        new = self._next_limit(ratio, binding, dropped, slow_started)
        if not self._probed:  # no floor yet (ratio 1 by definition): hold until the probe
            new = min(new, self._limit)
        if not binding and self._probed and self.shrink_headroom:
            shrunk = peak * self.shrink_headroom + math.sqrt(peak)
            new = min(new, max(shrunk, min(self.quiet_limit, self._limit)))
        self._limit = clamp(new, self.min_limit, self.max_limit)
        if not self._probed and not binding:  # nothing queued behind us: a no-load RTT
            self._probed = True
            self._schedule_probe(now)
        fresh_floor = self.windows - self._probe_end_window <= 2 * self.stuck_windows
        stuck = self._stuck >= self.stuck_windows and not fresh_floor
        if not self._probed or stuck or now >= self._next_probe_at:
            self._start_probe(now, self._pre_stuck_limit if stuck else None)

    def _count_stuck(self, ratio: float) -> None:
        """Count windows far above the floor whose ratio did not recover after a cut.

        "Far" is measured after ``queue_tolerance``: at 8 saturated workers the
        tolerated equilibrium (13-16 in flight) sits at ``ratio`` ~0.5, which
        is the controller doing its job, not a floor that moved.
        """
        if ratio * self.queue_tolerance >= self.stuck_ratio:
            self._stuck = 0
        elif self._stuck and ratio <= self._last_ratio * _RECOVERING:
            self._stuck += 1
        else:  # a new streak (or the last cut worked: queueing, not a moved floor)
            self._stuck = 1
            self._pre_stuck_limit = self._limit
        self._last_ratio = ratio

    def _next_limit(self, ratio: float, binding: bool, dropped: bool, slow: bool) -> float:
        limit = self._limit
        tolerance = self.queue_tolerance_binding if binding else self.queue_tolerance
        gradient = clamp(ratio * tolerance, self.min_gradient, 1.0)
        new = limit * gradient + math.sqrt(limit)
        if not binding or dropped:
            return min(new, limit)
        if ratio * self.tolerance >= 1.0 and not slow:  # slow start already grew it
            return max(new, limit * self.growth_factor)
        return new

    # -- probing --------------------------------------------------------------
    def _start_probe(self, now: float, pre_stuck_limit: float | None) -> None:
        self._probe_start = now
        self._probe_rtts = []
        self._saved_limit = self._limit
        self._stuck = 0
        self._probe_restore = pre_stuck_limit

    def _probe_sample(self, start: float, held: int, backend: float, rtt: float) -> None:
        probe_start = self._probe_start
        if probe_start is not None and start >= probe_start and held <= self.limit:
            self._probe_rtts.append(backend)
            self._keep_route_rtt(rtt)

    def _maybe_end_probe(self, now: float) -> None:
        start = self._probe_start
        assert start is not None
        enough = len(self._probe_rtts) >= self.probe_samples
        if not enough and now - start < self.probe_max_windows * self.window_s:
            return
        if self._probe_rtts:
            old, new = self._rtt_noload_s, percentile(self._probe_rtts, self.rtt_percentile)
            moved = old is not None and new * self.stuck_ratio > old
            if moved and self._probe_restore is not None:  # the cuts chased a stale floor
                self._saved_limit = max(self._saved_limit, self._probe_restore)
            if self.routes is not None:
                self.routes.close_probe(moved and self._probe_restore is not None)
            else:
                self._rtt_noload_s = new
            self._probed = True
            self.probes += 1
        self._probe_start = None
        self._probe_ended_at = now
        self._probe_end_window = self.windows
        self._limit = self._saved_limit
        self._reset_window(now)
        self._schedule_probe(now)

    def _schedule_probe(self, now: float) -> None:
        if self.routes is not None:  # floors refresh from calm windows: no periodic probe
            self._next_probe_at = math.inf
            return
        jitter = 1.0 + self._rng.uniform(-self.probe_jitter, self.probe_jitter)
        self._next_probe_at = now + self.probe_interval_s * jitter


unpacks_into_on_result(GradientLimit.on_sample)  # ``base.result_feed``: no ``Sample`` built


def _check_params(
    window_ms: float, p: float, tolerance: float, growth: float, backoff: float
) -> None:
    if window_ms <= 0:
        raise ValueError(f"window_ms must be > 0, got {window_ms}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"rtt_percentile must be in [0, 1], got {p}")
    if tolerance < 1.0:
        raise ValueError(f"tolerance must be >= 1.0, got {tolerance}")
    if growth < 1.0:
        raise ValueError(f"growth_factor must be >= 1.0, got {growth}")
    if not 0.0 < backoff < 1.0:
        raise ValueError(f"backoff_ratio must be in (0, 1), got {backoff}")


def _check_more(min_gradient: float, stuck: float, fast_close: float, probe_s: float) -> None:
    if not 0.0 < min_gradient <= 1.0:
        raise ValueError(f"min_gradient must be in (0, 1], got {min_gradient}")
    if not 0.0 < stuck <= 1.0:
        raise ValueError(f"stuck_ratio must be in (0, 1], got {stuck}")
    if fast_close <= 1.0:
        raise ValueError(f"fast_close_ratio must be > 1, got {fast_close}")
    if probe_s <= 0:
        raise ValueError(f"probe_interval_s must be > 0, got {probe_s}")
