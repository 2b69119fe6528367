"""Per-instance metrics, read from the pool at scrape time.

A custom collector registered on the gateway's registry: the hot path touches
nothing. The ``instance`` label is the instance's URL without userinfo; its
values are the configured instances (at most ``MAX_INSTANCES``), and a removed
instance disappears from the next scrape, so the label stays bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ballast_asgi.core.types import Clock
from ballast_asgi.upstreams.core.instance import Instance
from ballast_asgi.upstreams.core.pool import Pool

_LABELS = ["instance"]
_GAUGES: tuple[tuple[str, str, Callable[[Instance, float], float]], ...] = (
    ("ballast_upstream_inflight_requests", "Attempts out on the instance.",
     lambda i, now: float(i.outstanding)),
    ("ballast_upstream_concurrency_limit", "The instance's own concurrency limit.",
     lambda i, now: float(i.limiter.limit)),
    ("ballast_upstream_healthy", "1 when the instance passes its active probes.",
     lambda i, now: float(i.health.healthy)),
    ("ballast_upstream_ejected", "1 while the instance is ejected by outlier detection.",
     lambda i, now: float(i.outlier.ejected(now))),
    ("ballast_upstream_routable", "1 when the instance is in the rotation.",
     lambda i, now: float(i.routable(now))),
    ("ballast_upstream_weight", "The instance's configured weight.",
     lambda i, now: float(i.weight)),
)  # fmt: skip
_COUNTERS: tuple[tuple[str, str, Callable[[Instance], float]], ...] = (
    ("ballast_upstream_attempts", "Attempts sent to the instance.", lambda i: float(i.requests)),
    ("ballast_upstream_failures", "Attempts that failed on the instance.",
     lambda i: float(i.failures)),
    ("ballast_upstream_ejections", "Times the instance was ejected.",
     lambda i: float(i.outlier.ejections)),
)  # fmt: skip


class PoolCollector(Collector):
    """Yields the per-instance families from the live pool."""

    def __init__(self, pool: Callable[[], Pool | None], clock: Clock) -> None:
        self._pool = pool
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        pool = self._pool()
        instances = [] if pool is None else pool.instances
        now = self._clock()
        for name, doc, read in _GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=_LABELS)
            for inst in instances:
                gauge.add_metric([inst.key], read(inst, now))
            yield gauge
        for name, doc, count in _COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=_LABELS)
            for inst in instances:
                counter.add_metric([inst.key], count(inst))
            yield counter

    def describe(self) -> Iterator[Metric]:
        """Declared up front (the registry's duplicate check), read lazily."""
        for name, doc, _ in _GAUGES:
            yield GaugeMetricFamily(name, doc, labels=_LABELS)
        for name, doc, _ in _COUNTERS:
            yield CounterMetricFamily(name, doc, labels=_LABELS)


def register(registry: CollectorRegistry, pool: Callable[[], Pool | None], clock: Clock) -> None:
    """Add the per-instance families to ``registry``."""
    registry.register(PoolCollector(pool, clock))
