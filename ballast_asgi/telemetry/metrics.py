"""Every metric the gateway exports, declared in one place.

One ``Metrics`` object per gateway, over its own ``CollectorRegistry`` (never
the global one). Names are prefixed ``ballast_``, use base units (seconds,
bytes) and counters end in ``_total``. Every label takes values from a closed
set (``ShedReason``, ``Priority``, fixed outcome names), so cardinality is
bounded. Gauges that mirror live state (limit, in-flight, queue depth, breaker
state) are read at scrape time through callbacks bound by the composition
root, so the hot path never touches them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.priority import ALL_PRIORITIES, Priority
from ballast_asgi.telemetry.hot_values import make_hot, observer

#: Latency buckets in seconds, 1 ms .. 30 s.
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
)  # fmt: skip

QUEUE_OUTCOMES = ("admitted", "timeout", "queue_full")
RETRY_RESULTS = ("attempted", "succeeded", "denied")
BREAKER_STATES = ("closed", "open", "half_open")


class Metrics:
    """The gateway's metrics over an injected (or private) registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.concurrency_limit = Gauge(
            "ballast_concurrency_limit", "Current concurrency limit.", registry=r
        )
        self.inflight = Gauge(
            "ballast_inflight_requests", "Requests holding a concurrency permit.", registry=r
        )
        self.rtt_recent = Gauge(
            "ballast_limiter_rtt_recent_seconds", "Recent round-trip time seen by the limiter.",
            registry=r,
        )  # fmt: skip
        self.rtt_min = Gauge(
            "ballast_limiter_rtt_min_seconds", "No-load (minimum) round-trip time estimate.",
            registry=r,
        )  # fmt: skip
        self.queue_depth = Gauge(
            "ballast_admission_queue_depth", "Requests waiting in the admission queue.",
            ["priority"], registry=r,
        )  # fmt: skip
        self.queued = Counter(
            "ballast_admission_queued", "Admission-queue outcomes.", ["outcome"], registry=r
        )
        self.shed = Counter(
            "ballast_shed", "Requests shed, by reason and priority.", ["reason", "priority"],
            registry=r,
        )  # fmt: skip
        self.dry_run_shed = Counter(
            "ballast_dry_run_shed",
            "Dry-run: requests admitted that enforcement would have shed.",
            ["reason", "priority"], registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "ballast_requests", "Requests that reached the shedding stages.", ["priority"],
            registry=r,
        )  # fmt: skip
        self.bad_requests = Counter(
            "ballast_bad_requests", "Requests rejected with 400 for a malformed header.",
            ["header"], registry=r,
        )  # fmt: skip
        self.priority_ignored = Counter(
            "ballast_priority_header_ignored",
            "X-Priority headers ignored because the sender is not trusted.", registry=r,
        )  # fmt: skip
        self.upstream_latency = Histogram(
            "ballast_upstream_latency_seconds", "Upstream round-trip time per attempt.",
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.upstream_errors = Counter(
            "ballast_upstream_errors", "Upstream failures by kind.", ["kind"], registry=r
        )
        self.client_send_timeouts = Counter(
            "ballast_client_send_timeouts", "Responses aborted: the client stopped reading.",
            registry=r,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "ballast_queue_wait_seconds", "Time spent waiting in the queue.", ["priority"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.breaker_state = Gauge(
            "ballast_breaker_state",
            "1 for the state of the most open route breaker.",
            ["state"],
            registry=r,
        )
        self.breaker_state_seconds = Gauge(
            "ballast_breaker_state_seconds", "Seconds spent in the current breaker state.",
            registry=r,
        )  # fmt: skip
        self.breaker_transitions = Counter(
            "ballast_breaker_transitions", "Breaker transitions by target state.", ["to"],
            registry=r,
        )  # fmt: skip
        self.retries = Counter(
            "ballast_retries", "Retries attempted, succeeded, or denied by the budget.",
            ["result"], registry=r,
        )  # fmt: skip
        self.retry_budget_balance = Gauge(
            "ballast_retry_budget_balance", "Retries the budget would allow right now.",
            registry=r,
        )  # fmt: skip
        self.body_timeouts = Counter(
            "ballast_body_timeouts",
            "Request bodies too slow: refused with 408 (buffer) or cut off (stream)",
            ["phase"],
            registry=r,
        )
        self.handler_deadline_cancelled = Counter(
            "ballast_handler_deadline_cancelled",
            "In-app handlers cancelled because the request's deadline passed",
            registry=r,
        )
        self.config_reloads = Counter(
            "ballast_config_reloads", "Config reload attempts.", ["result"], registry=r
        )
        # Pre-resolved children: the hot path never formats label tuples.
        self._shed = {
            (reason, p): self.shed.labels(reason.value, p.label)
            for reason in ShedReason
            for p in ALL_PRIORITIES
        }
        self._dry = {
            (reason, p): self.dry_run_shed.labels(reason.value, p.label)
            for reason in ShedReason
            for p in ALL_PRIORITIES
        }
        self._requests = {p: self.requests.labels(p.label) for p in ALL_PRIORITIES}
        # Compiled, the values the request path adds to take no lock (``hot_values.py``).
        for child in (*self._shed.values(), *self._dry.values(), *self._requests.values()):
            make_hot(child)
        # The two counters every shed increments (issue 31): their value's own ``inc``,
        # bound once (``Counter.inc`` adds an observability check and a sign check per call).
        self._shed_inc = {k: _adder(c) for k, c in self._shed.items()}
        self._requests_inc = {p: _adder(c) for p, c in self._requests.items()}
        #: ``count_request``'s adder per tier (``adder(1)`` counts one request): for a
        #: stage that counts every request and keeps the mapping (one call less).
        self.request_adders: Mapping[Priority, Callable[[float], None]] = self._requests_inc
        #: ``count_shed``'s adder per (reason, tier), the same way.
        self.shed_adders: Mapping[tuple[ShedReason, Priority], Callable[[float], None]] = (
            self._shed_inc
        )
        self._queued = {o: self.queued.labels(o) for o in QUEUE_OUTCOMES}
        self._queue_wait = {p: observer(self.queue_wait.labels(p.label)) for p in ALL_PRIORITIES}
        self._retries = {r_: self.retries.labels(r_) for r_ in RETRY_RESULTS}
        for child in (*self._queued.values(), *self._retries.values()):
            make_hot(child)
        #: ``upstream_latency.observe``, compiled without a lock (``hot_values.py``).
        self.observe_upstream_latency = observer(self.upstream_latency)
        self.priority_ignored.inc(0)

    # -- hot path -----------------------------------------------------------
    def count_shed(self, reason: ShedReason, priority: Priority) -> None:
        """Count one shed request."""
        self._shed_inc[(reason, priority)](1)

    def count_would_shed(self, reason: ShedReason, priority: Priority) -> None:
        """Dry-run: count one request enforcement would have shed."""
        self._dry[(reason, priority)].inc()

    def count_request(self, priority: Priority) -> None:
        """Count one request entering the shedding stages."""
        self._requests_inc[priority](1)

    def count_queued(self, outcome: str) -> None:
        """Count one admission-queue outcome (admitted, timeout, queue_full)."""
        self._queued[outcome].inc()

    def observe_queue_wait(self, priority: Priority, seconds: float) -> None:
        """Record how long a request waited in the queue."""
        self._queue_wait[priority](seconds)

    def count_retry(self, result: str) -> None:
        """Count a retry attempted, succeeded, or denied."""
        self._retries[result].inc()

    # -- scrape-time bindings -----------------------------------------------
    def bind_limiter(
        self,
        limit: Callable[[], float],
        inflight: Callable[[], float],
        rtt_recent: Callable[[], float] | None = None,
        rtt_min: Callable[[], float] | None = None,
    ) -> None:
        """Read the limiter's live state at scrape time."""
        self.concurrency_limit.set_function(limit)
        self.inflight.set_function(inflight)
        if rtt_recent is not None:
            self.rtt_recent.set_function(rtt_recent)
        if rtt_min is not None:
            self.rtt_min.set_function(rtt_min)

    def bind_queue_depth(self, depth: Callable[[Priority], int]) -> None:
        """Read the queue depth per tier at scrape time."""
        for p in ALL_PRIORITIES:
            self.queue_depth.labels(p.label).set_function(functools.partial(depth, p))

    def bind_breaker(self, state: Callable[[], str], seconds_in_state: Callable[[], float]) -> None:
        """Read the breaker's state at scrape time."""
        for name in BREAKER_STATES:
            self.breaker_state.labels(name).set_function(functools.partial(_is_state, state, name))
        self.breaker_state_seconds.set_function(seconds_in_state)

    def exposition(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)


def null_metrics() -> Metrics:
    """Metrics over a private throwaway registry, for unit tests and embedding."""
    return Metrics(CollectorRegistry(auto_describe=True))


def _is_state(state: Callable[[], str], name: str) -> float:
    return float(state() == name)


def _adder(child: Counter) -> Callable[[float], None]:
    """``child.inc`` without its per-call checks: the value's own ``inc`` (prometheus_client's
    ``MutexValue``, or ``MmapedValue`` in multiprocess mode), bound once; ``child.inc``
    itself when the value is not such an object (another prometheus_client)."""
    value = getattr(child, "_value", None)
    inc = getattr(value, "inc", None)
    return inc if callable(inc) else child.inc
