"""Per-route no-load RTTs: judge each sample against its own route's baseline (ADR 0016).

A service whose endpoints differ 1000x in latency has no single "no-load RTT":
against the fastest route's floor a healthy 1 s endpoint reads as a queue of
1,000. ``RouteFloors`` keeps one floor per route key and turns every sample
into a *relative* RTT, ``backend_rtt / floor[route]`` (1.0: the route's
no-load latency), which the gradient controller then reads exactly as it read
seconds before, with a floor of 1.0.

* **The table is bounded**: at most ``max_routes`` keys; once full, a new key
  shares the overflow entry ``~other``. Keys come from the gateway's route
  grouping (never raw client paths), so the bound is a last line.
* **A floor falls at once**: the first success of a route sets a provisional
  floor, the route's first window median (>= ``MIN_ROUTE_SAMPLES``) replaces
  it when within ``PROVISIONAL_SPREAD`` of it (a lucky first sample; a median
  further above has queued: a route first seen under overload), and any later
  window median below the floor lowers it.
* **A floor rises without a probe dip**: every ``refresh_s`` each route's floor
  becomes the lowest median it had in the windows of that period that were
  *not binding* (nothing waited for a permit: the gateway caused no queue);
  a route with no such window keeps its floor. Nothing pins the limit.
* **Probes** (the controller's first one, and those after a stuck streak) hand
  their samples over too: a probe ran at a low limit, so its per-route
  medians lower the floors of the routes it saw (and replace them when the
  stuck streak says the backend got slower).

Pure: no clock, no I/O; the controller passes ``now``.
"""

from __future__ import annotations

import math

#: The overflow key once ``max_routes`` keys are known.
OTHER_ROUTE = "~other"
#: Default bound of the table.
DEFAULT_MAX_ROUTES = 64
#: A route's first window median replaces its first sample's floor only when at
#: most this much above it (no-load spread); higher, it has queued behind others.
PROVISIONAL_SPREAD = 1.5
#: A route's window median counts only with at least this many samples.
MIN_ROUTE_SAMPLES = 3
_MAX_ROUTE_SAMPLES = 2_000


def percentile(values: list[float], p: float) -> float:
    """The ``p``-quantile (0..1) of a non-empty list, nearest rank below."""
    ordered = sorted(values)
    return ordered[int(p * (len(ordered) - 1))]


class RouteFloors:
    """Bounded route -> no-load RTT table, fed by the gradient controller."""

    def __init__(self, *, max_routes: int, refresh_s: float, percentile: float) -> None:
        if max_routes < 1:
            raise ValueError(f"max_routes must be >= 1, got {max_routes}")
        self.max_routes = max_routes
        self.refresh_s = refresh_s
        self.percentile = percentile
        self.floors: dict[str, float] = {}
        self._provisional: set[str] = set()
        self._pending: dict[str, list[float]] = {}
        self._calm_min: dict[str, float] = {}
        self._refresh_at: float | None = None
        #: Floors raised or lowered by a refresh (observability).
        self.refreshes = 0

    def key(self, route: str) -> str:
        """``route``, or the overflow key when the table is full."""
        if route in self.floors or route in self._pending:
            return route
        if len(self.floors.keys() | self._pending.keys()) < self.max_routes - 1:
            return route
        return OTHER_ROUTE

    def relative(self, key: str, rtt_s: float, success: bool) -> float:
        """``rtt_s`` in units of ``key``'s floor (a first success sets a provisional one)."""
        floor = self.floors.get(key)
        if floor is None:
            if not success:
                return 1.0  # a failure on an unknown route: a drop at the no-load RTT
            self.floors[key] = floor = rtt_s
            self._provisional.add(key)
        return rtt_s / floor

    def record(self, key: str, rtt_s: float) -> None:
        """Keep a success's raw RTT for its route's next window (or probe) median."""
        values = self._pending.get(key)
        if values is None:
            self._pending[key] = [rtt_s]
        elif len(values) < _MAX_ROUTE_SAMPLES:
            values.append(rtt_s)

    def close_window(self, binding: bool, now: float) -> None:
        """Window medians lower floors; calm ones are kept for the next refresh."""
        for key, median in self._medians().items():
            floor = self.floors.get(key, math.inf)
            if key in self._provisional:  # the first sample may have been lucky (spread) ...
                self._provisional.discard(key)
                if median <= PROVISIONAL_SPREAD * floor:  # ... or the median may have queued
                    self.floors[key] = median
            elif median < floor:
                self.floors[key] = median
            if not binding:
                self._calm_min[key] = min(self._calm_min.get(key, math.inf), median)
        if self._refresh_at is None:
            self._refresh_at = now + self.refresh_s
        elif now >= self._refresh_at:
            for key, low in self._calm_min.items():
                if key in self.floors and low != self.floors[key]:
                    self.floors[key] = low
                    self.refreshes += 1
            self._calm_min = {}
            self._refresh_at = now + self.refresh_s

    def close_probe(self, moved: bool) -> None:
        """A probe's per-route medians (measured at a low limit) lower those floors.

        They replace them (a rise too) only when ``moved``: the controller's
        stuck streak and the probe agree that the backend got slower. A probe
        right after an overload still finds the backend's own backlog, which
        is not a floor (the first probe of a gateway started at 12x).
        """
        for key, median in self._medians().items():
            if moved or key in self._provisional or median < self.floors.get(key, math.inf):
                self.floors[key] = median
            self._provisional.discard(key)

    def discard(self) -> None:
        """Forget pending samples (a window that said nothing)."""
        self._pending = {}

    def _medians(self) -> dict[str, float]:
        pending, self._pending = self._pending, {}
        return {
            key: percentile(values, self.percentile)
            for key, values in pending.items()
            if len(values) >= MIN_ROUTE_SAMPLES
        }

    def snapshot(self) -> dict[str, object]:
        """JSON-safe: the floors in milliseconds, by route key."""
        return {
            "routes": len(self.floors),
            "max_routes": self.max_routes,
            "refreshes": self.refreshes,
            "floors_ms": {k: round(v * 1e3, 3) for k, v in sorted(self.floors.items())},
        }
