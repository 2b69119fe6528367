"""The simulated backend's policy core (pure: time is passed in, randomness injected).

The model. ``workers`` identical servers sit behind one unbounded FIFO queue
(an M/G/c queue when arrivals are Poisson). A request waits in the queue until
a worker is free, then holds that worker for its service time::

    service_s = base_s * latency_multiplier,
    base_s    = slow_s with probability slow_fraction, else fast_s

and finishes with ``error_status`` with probability ``error_rate`` (errors take
their service time too). The service time is sampled when service *starts*,
so a profile change also applies to requests already queued. Capacity is::

    capacity_rps = workers / (((1 - slow_fraction) * fast_s + slow_fraction * slow_s)
                              * latency_multiplier)

which is 8 / (0.95 * 0.025 + 0.05 * 0.12) = 269 rps for the reference profile
(8 workers, 25 ms / 120 ms, 5% slow). Beyond it the queue grows without bound:
that deep queue is what the gateway must protect.

Resizing is live. Growing starts queued requests on the new workers at once.
Shrinking never interrupts a request in service: a worker that finishes while
more workers are busy than the profile allows retires instead of taking the
next request.

Path classes (``Profile.paths``, issue 28): a real service has endpoints of
very different latency. Each ``PathClass`` is a path prefix with its own
worker pool and its own service time (times ``latency_multiplier``); a request
whose path starts with a class's prefix (the first match in order) uses that
pool, any other request the default pool above. Each class's capacity is
``workers / service_s``; a saturated class queues without slowing the others.

Deadlines (``X-Deadline-Ms``) are only recorded: a request that finishes after
its deadline counts as ``finished_after_deadline`` (wasted work). With
``drop_expired`` a request whose deadline passed while it queued is dropped
when it reaches a worker, without service.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ballast_tools.hist import Histogram

T = TypeVar("T")

STAT_PERCENTILES = (50.0, 90.0, 99.0, 99.9)


#: At most this many path classes (the admin API's bound as well).
MAX_PATH_CLASSES = 16


@dataclass(frozen=True)
class PathClass:
    """An endpoint class: requests whose path starts with ``prefix``."""

    prefix: str
    workers: int
    service_s: float

    def __post_init__(self) -> None:
        if not self.prefix.startswith("/"):
            raise ValueError(f"paths[].prefix must start with '/', got {self.prefix!r}")
        if self.workers < 1:
            raise ValueError("paths[].workers must be >= 1")
        if self.service_s < 0:
            raise ValueError("paths[].service_s must be >= 0")


@dataclass(frozen=True)
class Profile:
    """How the backend behaves; every field can change live."""

    workers: int
    fast_s: float
    slow_s: float
    slow_fraction: float = 0.05
    latency_multiplier: float = 1.0
    error_rate: float = 0.0
    error_status: int = 500
    drop_expired: bool = False
    #: Endpoint classes, matched by path prefix in order (empty: one class).
    paths: tuple[PathClass, ...] = ()

    def __post_init__(self) -> None:
        if len(self.paths) > MAX_PATH_CLASSES:
            raise ValueError(f"paths holds at most {MAX_PATH_CLASSES} classes")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.fast_s < 0 or self.slow_s < 0:
            raise ValueError("fast_s and slow_s must be >= 0")
        if not 0.0 <= self.slow_fraction <= 1.0 or not 0.0 <= self.error_rate <= 1.0:
            raise ValueError("slow_fraction and error_rate must be in [0, 1]")
        if self.latency_multiplier <= 0:
            raise ValueError("latency_multiplier must be > 0")

    @property
    def mean_service_s(self) -> float:
        """Expected service time of one request."""
        base = (1.0 - self.slow_fraction) * self.fast_s + self.slow_fraction * self.slow_s
        return base * self.latency_multiplier

    @property
    def capacity_rps(self) -> float:
        """Throughput at 100% worker utilisation."""
        mean = self.mean_service_s
        return self.workers / mean if mean > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class Service:
    """What a worker does for one request."""

    duration_s: float
    error: bool = False
    expired: bool = False


def path_class(profile: Profile, path: str) -> int:
    """Index of the first class whose prefix ``path`` starts with; -1: the default pool."""
    for i, cls in enumerate(profile.paths):
        if path.startswith(cls.prefix):
            return i
    return -1


def sample_service(profile: Profile, rng: random.Random, cls: int = -1) -> Service:
    """Draw one request's service time and error outcome (``cls``: its path class)."""
    if cls >= 0:
        base_s = profile.paths[cls].service_s
    else:
        slow = rng.random() < profile.slow_fraction
        base_s = profile.slow_s if slow else profile.fast_s
    error = profile.error_rate > 0 and rng.random() < profile.error_rate
    return Service(base_s * profile.latency_multiplier, error)


class WorkerPool(Generic[T]):
    """``workers`` servers behind one FIFO queue of opaque waiter tokens."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.busy = 0
        self._queue: deque[T] = deque()

    @property
    def queue_len(self) -> int:
        """Requests waiting for a worker."""
        return len(self._queue)

    def arrive(self, token: T) -> bool:
        """True when a worker is free now (it is taken); else ``token`` is queued."""
        if self.busy < self.workers and not self._queue:
            self.busy += 1
            return True
        self._queue.append(token)
        return False

    def release(self) -> T | None:
        """A worker finished: it takes the next waiter (returned) or retires/idles."""
        if self.busy > self.workers or not self._queue:
            self.busy -= 1
            return None
        return self._queue.popleft()

    def resize(self, workers: int) -> list[T]:
        """Change the worker count; returns waiters that start on new workers now."""
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.workers = workers
        started: list[T] = []
        while self._queue and self.busy < self.workers:
            self.busy += 1
            started.append(self._queue.popleft())
        return started

    def remove(self, token: T) -> bool:
        """Take a waiter out of the queue (its client gave up); False if not queued."""
        try:
            self._queue.remove(token)
        except ValueError:
            return False
        return True


class SimStats:
    """Counters and latency histograms of what the simulator did."""

    def __init__(self) -> None:
        self.arrived = 0
        self.served = 0
        self.errored = 0
        self.finished_after_deadline = 0
        self.dropped_expired = 0
        self.max_queue_len = 0
        self.queue_wait_s = Histogram()
        self.service_s = Histogram()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe counters and percentiles (milliseconds)."""
        return {
            "arrived": self.arrived,
            "served": self.served,
            "errored": self.errored,
            "finished_after_deadline": self.finished_after_deadline,
            "dropped_expired": self.dropped_expired,
            "max_queue_len": self.max_queue_len,
            "queue_wait_ms": _ms_summary(self.queue_wait_s),
            "service_ms": _ms_summary(self.service_s),
        }


def _ms_summary(h: Histogram) -> dict[str, float | int | None]:
    out: dict[str, float | int | None] = {"count": h.count}
    for key, value in h.percentiles(STAT_PERCENTILES).items():
        out[key] = None if h.count == 0 else round(value * 1e3, 3)
    out["max"] = round(h.max * 1e3, 3) if h.count else None
    return out


def finite_or_none(value: float) -> float | None:
    """``value`` rounded for JSON, or None when infinite (zero service time)."""
    return round(value, 1) if math.isfinite(value) else None


class Simulator(Generic[T]):
    """Profile + worker pool + stats: the whole backend, driven by the caller's clock."""

    def __init__(self, profile: Profile, rng: random.Random) -> None:
        self.profile = profile
        self.rng = rng
        self.pool: WorkerPool[T] = WorkerPool(profile.workers)
        #: One pool per path class (``Profile.paths``), by class index.
        self.class_pools: list[WorkerPool[T]] = [WorkerPool(c.workers) for c in profile.paths]
        self.stats = SimStats()

    def classify(self, path: str) -> int:
        """The path class of ``path`` under the current profile (-1: default pool)."""
        return path_class(self.profile, path) if self.profile.paths else -1

    def _pool(self, cls: int) -> WorkerPool[T]:
        return self.class_pools[cls] if 0 <= cls < len(self.class_pools) else self.pool

    def arrive(self, token: T, cls: int = -1) -> bool:
        """A request arrives; True when it holds a worker now, else it is queued."""
        self.stats.arrived += 1
        pool = self._pool(cls)
        started = pool.arrive(token)
        if pool.queue_len > self.stats.max_queue_len:
            self.stats.max_queue_len = pool.queue_len
        return started

    def begin(
        self, arrived_s: float, deadline_s: float | None, now: float, cls: int = -1
    ) -> Service:
        """A request reached a worker: record its queue wait and draw its service."""
        self.stats.queue_wait_s.record(now - arrived_s)
        if self.profile.drop_expired and deadline_s is not None and now >= deadline_s:
            return Service(0.0, expired=True)
        if cls >= len(self.profile.paths):
            cls = -1  # the class was removed while the request waited
        service = sample_service(self.profile, self.rng, cls)
        self.stats.service_s.record(service.duration_s)
        return service

    def end(
        self, service: Service, deadline_s: float | None, now: float, cls: int = -1
    ) -> T | None:
        """A request leaves its worker; returns the waiter that takes the worker next."""
        stats = self.stats
        if service.expired:
            stats.dropped_expired += 1
        else:
            if service.error:
                stats.errored += 1
            else:
                stats.served += 1
            if deadline_s is not None and now > deadline_s:
                stats.finished_after_deadline += 1
        return self._pool(cls).release()

    def release(self, cls: int = -1) -> T | None:
        """Free a worker without recording anything (its waiter was gone)."""
        return self._pool(cls).release()

    def set_profile(self, profile: Profile) -> list[T]:
        """Apply a new profile live; returns waiters that start on added workers."""
        return [token for token, _ in self.set_profile_classes(profile)]

    def set_profile_classes(self, profile: Profile) -> list[tuple[T, int]]:
        """``set_profile``, with the path class of each waiter that starts.

        Class pools are matched by index: a class that stays keeps its pool
        (resized); a removed class's pool keeps draining its queue at its last
        size (its requests then use the default service time).
        """
        self.profile = profile
        started = [(token, -1) for token in self.pool.resize(profile.workers)]
        for i, cls in enumerate(profile.paths):
            if i < len(self.class_pools):
                started += [(token, i) for token in self.class_pools[i].resize(cls.workers)]
            else:
                self.class_pools.append(WorkerPool(cls.workers))
        return started

    def cancel(self, token: T) -> bool:
        """Remove a waiter that will not be served (e.g. server shutdown)."""
        return any(pool.remove(token) for pool in (self.pool, *self.class_pools))

    def reset_stats(self) -> None:
        """Start counting afresh (the queue and workers are untouched)."""
        self.stats = SimStats()

    def snapshot(self) -> dict[str, Any]:
        """Stats plus the live state of the queue and workers."""
        out = self.stats.to_dict()
        out.update(
            workers=self.pool.workers,
            busy=self.pool.busy + sum(p.busy for p in self.class_pools),
            queue_len=self.pool.queue_len + sum(p.queue_len for p in self.class_pools),
            capacity_rps=finite_or_none(self.profile.capacity_rps),
        )
        return out
