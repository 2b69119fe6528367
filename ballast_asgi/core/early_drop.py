"""Early drop and drain estimates (pure arithmetic over the limiter and queue).

A request that cannot make its deadline is better shed at admission than
queued: it would only hold a queue slot and, if granted, upstream work nobody
waits for. It cannot make it when::

    remaining_s < min_service_s                  # the limiter's windowed minimum RTT
    remaining_s < ahead_of(tier) / throughput_rps  # its tier's expected queue wait

Both estimates are skipped while unknown (no RTT sample yet, no throughput
measured), so a cold gateway never drops on a guess.

The drain estimate behind ``Retry-After`` is ``queue.total / throughput_rps``
seconds (1 s when nothing is known).
"""

from __future__ import annotations

from collections.abc import Callable

from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.queue import PriorityQueue
from ballast_asgi.core.types import Clock


def expected_wait_s(ahead: int, throughput_rps: float) -> float:
    """Seconds until ``ahead`` waiters are served at ``throughput_rps`` (0 when unknown)."""
    if ahead <= 0 or throughput_rps <= 0.0:
        return 0.0
    return ahead / throughput_rps


def cannot_make_it(remaining_s: float, min_service_s: float | None, wait_s: float) -> bool:
    """True when the remaining budget is shorter than the service time or the wait."""
    if min_service_s is not None and remaining_s < min_service_s:
        return True
    return remaining_s < wait_s


class EarlyDropEstimator:
    """Decides early drops from a limiter and (optionally) the queue in front of it."""

    def __init__(self, limiter: Limiter, queue: PriorityQueue | None = None) -> None:
        self.limiter = limiter
        self.queue = queue

    def expected_wait_s(self, priority: Priority, now: float) -> float:
        """The expected queue wait of a newcomer of ``priority``."""
        if self.queue is None:
            return 0.0
        return expected_wait_s(self.queue.ahead_of(priority), self.limiter.throughput_rps(now))

    def should_drop(self, remaining_s: float, priority: Priority, now: float) -> bool:
        """True when a request with ``remaining_s`` left cannot make its deadline."""
        wait_s = self.expected_wait_s(priority, now)
        return cannot_make_it(remaining_s, self.limiter.rtt_min_s, wait_s)


def drain_estimate_s(depth: int, throughput_rps: float) -> float:
    """Seconds until ``depth`` queued requests drain (1.0 when unknown)."""
    if throughput_rps <= 0.0:
        return 1.0
    return depth / throughput_rps


def make_drain_estimate(
    queue: PriorityQueue, limiter: Limiter, clock: Clock
) -> Callable[[], float]:
    """A zero-argument drain estimate for ``ShedResponder.drain_estimate``."""

    def estimate() -> float:
        return drain_estimate_s(queue.total, limiter.throughput_rps(clock()))

    return estimate
