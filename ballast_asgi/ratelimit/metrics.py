"""Export a rate limiter's plain counters to Prometheus at scrape time.

Registered once on the gateway's registry; it reads whichever limiter is
current (a reload may replace it). Names: ``ballast_ratelimit_*``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ballast_asgi.ratelimit.core.breaker import CLOSED, HALF_OPEN, OPEN
from ballast_asgi.ratelimit.factory import RateLimiter
from ballast_asgi.ratelimit.stats import LATENCY_BUCKETS, SOURCES, RateLimitStats

Metric = CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily


class RateLimitCollector(Collector):
    """Yields the ``ballast_ratelimit_*`` families from ``current()``'s stats."""

    def __init__(self, current: Callable[[], RateLimiter | None]) -> None:
        self.current = current

    def collect(self) -> Iterator[Metric]:
        """One family per measurement; nothing when rate limiting is off."""
        limiter = self.current()
        if limiter is None:
            return
        s = limiter.stats
        decisions = CounterMetricFamily(
            "ballast_ratelimit_decisions",
            "Rate-limit decisions by mode, outcome and source (redis, local, degraded).",
            labels=["mode", "outcome", "source"],
        )
        for outcome in ("allowed", "denied"):
            for source in SOURCES:
                decisions.add_metric(
                    [limiter.mode, outcome, source], s.decisions[(outcome, source)]
                )
        yield decisions
        yield CounterMetricFamily(
            "ballast_ratelimit_degraded_decisions",
            "Decisions made on this gateway's own share because Redis did not answer.",
            value=s.decisions[("allowed", "degraded")] + s.decisions[("denied", "degraded")],
        )
        calls = CounterMetricFamily(
            "ballast_ratelimit_redis_calls", "Redis round trips by operation and result.",
            labels=["op", "result"],
        )  # fmt: skip
        for (op, result), n in sorted(s.redis_calls.items()):
            calls.add_metric([op, result], n)
        yield calls
        yield _histogram(
            "ballast_ratelimit_redis_latency_seconds", "Redis call latency (calls that answered).",
            s.latency_counts, s.latency_sum,
        )  # fmt: skip
        yield _histogram(
            "ballast_ratelimit_decision_wait_seconds",
            "How long requests waited for their rate-limit decision (bounded by the Redis"
            " timeout).",
            s.wait_counts, s.wait_sum,
        )  # fmt: skip
        state = GaugeMetricFamily(
            "ballast_ratelimit_redis_breaker_state", "1 for the Redis breaker's state.",
            labels=["state"],
        )  # fmt: skip
        current = limiter.breaker_state()
        for name in (CLOSED, OPEN, HALF_OPEN):
            state.add_metric([name], float(current == name))
        yield state
        yield GaugeMetricFamily(
            "ballast_ratelimit_live_gateways", "Gateways sharing the limit (heartbeats).",
            value=limiter.live_gateways(),
        )  # fmt: skip
        yield from _lease(s)


def _histogram(name: str, doc: str, counts: list[int], total: float) -> HistogramMetricFamily:
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, n in zip((*LATENCY_BUCKETS, float("inf")), counts, strict=True):
        running += n
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=total)


def _lease(s: RateLimitStats) -> Iterator[Metric]:
    yield CounterMetricFamily(
        "ballast_ratelimit_lease_requests", "Lease calls made.", value=s.lease_requests
    )
    tokens = CounterMetricFamily(
        "ballast_ratelimit_lease_tokens", "Lease tokens granted and given back.",
        labels=["direction"],
    )  # fmt: skip
    tokens.add_metric(["granted"], s.lease_tokens_granted)
    tokens.add_metric(["returned"], s.lease_tokens_returned)
    yield tokens
    yield GaugeMetricFamily(
        "ballast_ratelimit_lease_size", "Tokens asked for in the last lease.",
        value=s.last_lease_size,
    )  # fmt: skip
    charge = CounterMetricFamily(
        "ballast_ratelimit_charge_back", "Requests admitted without Redis, charged or lapsed.",
        labels=["result"],
    )  # fmt: skip
    charge.add_metric(["charged"], s.charged_back)
    charge.add_metric(["lapsed"], s.charge_lapsed)
    yield charge
