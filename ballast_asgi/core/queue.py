"""The priority queue with a LIFO tail (pure: waiters are plain objects, time is passed in).

**Order.** Tiers are served strictly by priority (CRITICAL, then STANDARD,
then BULK). Within a tier the queue is FIFO while the tier's depth is at or
below ``lifo_threshold`` and LIFO (newest first) above it: under overload the
oldest waiter is the closest to its deadline, so serving it first spends
capacity on answers nobody will wait for.

**Bounds.** At most ``max_size`` waiters in total. With ``per_priority`` the
non-critical tiers together may hold only ``floor((1 - reserved_fraction) *
max_size)`` waiters; the rest is reserved for CRITICAL, which may use it all.

**Displacement.** When a newcomer does not fit, the *oldest waiter of the
lowest non-empty tier strictly below the newcomer's* is displaced (shed with
``queue_full``): the lowest tier gives way first, and within it the oldest is
the one closest to timing out anyway. A newcomer with no lower tier to
displace is refused (``queue_full``).

**Expiry.** A waiter carries its absolute ``deadline`` and optional
``timeout_at`` (arrival + queue timeout). ``Waiter.expiry()`` says when and
why it must leave (the adapter arms one timer per waiter from it);
``expire(now)`` removes every waiter due, for tests and polling callers.

**Dispatch.** ``dispatch(queue, limiter, now, deliver)`` hands free permits to
the best waiters. ``deliver(waiter, permit)`` returns False when the waiter
can no longer take it (its client went away, it timed out at the same
instant); the same permit then goes to the next waiter, and a permit nobody
takes is released as IGNORED. So a permit is never leaked nor granted twice.
With a partitioned limiter (one limit per route, ADR 0016) it instead pops
the best waiter *whose route has a free permit* (a full route does not block
the others) and takes that route's permit.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ballast_asgi.core.limiter import Limiter, Permit
from ballast_asgi.core.outcome import Outcome, ShedReason
from ballast_asgi.core.priority import ALL_PRIORITIES, Priority

_SEQ = itertools.count()
_CRITICAL, _IGNORED = Priority.CRITICAL, Outcome.IGNORED  # read once: an Enum attribute is slow

#: Defaults (``AdmissionQueueConfig`` references them): 1000 waiters, FIFO up to
#: 16 per tier, half of the queue reserved for the critical tier.
DEFAULT_MAX_SIZE = 1000
DEFAULT_LIFO_THRESHOLD = 16
DEFAULT_PER_PRIORITY = True
DEFAULT_RESERVED_FRACTION = 0.5


@dataclass(eq=False, slots=True)
class Waiter:
    """One request waiting for a permit."""

    priority: Priority
    enqueued_at: float
    #: Absolute deadline (monotonic seconds) or None.
    deadline: float | None = None
    #: enqueued_at + queue timeout, or None.
    timeout_at: float | None = None
    #: Opaque adapter data (e.g. the future the request awaits).
    handle: Any = None
    #: The route key of a partitioned limiter (ADR 0016).
    route: str = ""
    seq: int = field(default_factory=_SEQ.__next__)

    def expiry(self) -> tuple[float, ShedReason] | None:
        """When this waiter must leave the queue, and why (None: never)."""
        if self.deadline is None and self.timeout_at is None:
            return None
        if self.timeout_at is None or (
            self.deadline is not None and self.deadline <= self.timeout_at
        ):
            assert self.deadline is not None
            return self.deadline, ShedReason.DEADLINE
        return self.timeout_at, ShedReason.QUEUE_TIMEOUT


@dataclass(slots=True)
class PushResult:
    """What happened to a newcomer: accepted (maybe displacing a waiter) or refused."""

    accepted: bool
    displaced: Waiter | None = None


class PriorityQueue:
    """Bounded three-tier queue, FIFO below ``lifo_threshold`` and LIFO above."""

    def __init__(
        self,
        *,
        max_size: int = DEFAULT_MAX_SIZE,
        lifo_threshold: int = DEFAULT_LIFO_THRESHOLD,
        per_priority: bool = DEFAULT_PER_PRIORITY,
        reserved_fraction: float = DEFAULT_RESERVED_FRACTION,
    ) -> None:
        self.reconfigure(max_size=max_size, lifo_threshold=lifo_threshold,
            per_priority=per_priority, reserved_fraction=reserved_fraction)  # fmt: skip
        self._tiers: dict[Priority, deque[Waiter]] = {p: deque() for p in ALL_PRIORITIES}
        self._total = 0
        #: Waiters per route key (ADR 0016: dispatch looks only at routes with room).
        self._routes: dict[str, int] = {}

    def reconfigure(
        self,
        *,
        max_size: int,
        lifo_threshold: int,
        per_priority: bool,
        reserved_fraction: float,
    ) -> None:
        """Change the bounds (config reload). Waiters already queued stay queued;
        only later pushes see the new bounds."""
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        if lifo_threshold < 0:
            raise ValueError(f"lifo_threshold must be >= 0, got {lifo_threshold}")
        if not 0.0 <= reserved_fraction <= 1.0:
            raise ValueError(f"reserved_fraction must be in [0, 1], got {reserved_fraction}")
        self.max_size = max_size
        self.lifo_threshold = lifo_threshold
        self.per_priority = per_priority
        self.reserved_fraction = reserved_fraction
        shared = int((1.0 - reserved_fraction) * max_size) if per_priority else max_size
        #: How many non-critical waiters may queue.
        self.shared_cap = shared

    # -- state ----------------------------------------------------------------
    @property
    def total(self) -> int:
        """Waiters queued, all tiers."""
        return self._total

    def depth(self, priority: Priority) -> int:
        """Waiters queued in one tier."""
        return len(self._tiers[priority])

    def ahead_of(self, priority: Priority) -> int:
        """How many waiters a newcomer of ``priority`` would wait behind."""
        higher = sum(len(self._tiers[p]) for p in ALL_PRIORITIES if p < priority)
        own = len(self._tiers[priority])
        return higher if own >= self.lifo_threshold else higher + own

    def snapshot(self) -> dict[str, object]:
        """JSON-safe state for ``/snapshot``."""
        return {
            "depth": {p.label: len(self._tiers[p]) for p in ALL_PRIORITIES},
            "total": self._total,
            "max_size": self.max_size,
            "shared_cap": self.shared_cap,
            "lifo_threshold": self.lifo_threshold,
            "per_priority": self.per_priority,
        }

    def would_refuse(self, priority: Priority) -> bool:
        """Whether ``push`` would refuse a waiter of ``priority`` now (full, no lower-tier
        waiter to displace); takes nothing."""
        return not self._fits(priority) and self._victim(priority) is None

    # -- mutation -------------------------------------------------------------
    def push(self, waiter: Waiter) -> PushResult:
        """Queue ``waiter``, displacing a lower-tier waiter if it is full."""
        displaced = None
        if not self._fits(waiter.priority):
            displaced = self._victim(waiter.priority)
            if displaced is None:
                return PushResult(accepted=False)
            self.remove(displaced)
        self._tiers[waiter.priority].append(waiter)
        self._add(waiter, 1)
        return PushResult(accepted=True, displaced=displaced)

    def _add(self, waiter: Waiter, delta: int) -> None:
        self._total += delta
        left = self._routes.get(waiter.route, 0) + delta
        if left:
            self._routes[waiter.route] = left
        else:
            del self._routes[waiter.route]

    def queued_routes(self) -> list[str]:
        """The route keys that have at least one waiter."""
        return list(self._routes)

    def pop_best(self, fits: Callable[[Waiter], bool] | None = None) -> Waiter | None:
        """The next waiter to serve (highest tier; FIFO or LIFO by depth), removed.

        With ``fits``, the first waiter in that order for which it is True (a
        scan: the queue is bounded by ``max_size``).
        """
        for p in ALL_PRIORITIES:
            tier = self._tiers[p]
            if not tier:
                continue
            lifo = len(tier) > self.lifo_threshold
            if fits is None:
                w = tier.pop() if lifo else tier.popleft()
                self._add(w, -1)
                return w
            for w in reversed(tier) if lifo else tier:
                if fits(w):
                    tier.remove(w)
                    self._add(w, -1)
                    return w
        return None

    def push_front(self, waiter: Waiter) -> None:
        """Put back a waiter just popped, where it was served from (no bound check)."""
        tier = self._tiers[waiter.priority]
        if len(tier) >= self.lifo_threshold:
            tier.append(waiter)
        else:
            tier.appendleft(waiter)
        self._add(waiter, 1)

    def remove(self, waiter: Waiter) -> bool:
        """Take ``waiter`` out (timeout, disconnect); False if it was not queued."""
        try:
            self._tiers[waiter.priority].remove(waiter)
        except ValueError:
            return False
        self._add(waiter, -1)
        return True

    def expire(self, now: float) -> list[tuple[Waiter, ShedReason]]:
        """Remove and return every waiter whose expiry is at or before ``now``."""
        due = []
        for tier in self._tiers.values():
            for w in tier:
                exp = w.expiry()
                if exp is not None and exp[0] <= now:
                    due.append((w, exp[1]))
        for w, _ in due:
            self.remove(w)
        return due

    def _fits(self, priority: Priority) -> bool:
        if self._total >= self.max_size:
            return False
        if priority is _CRITICAL:
            return True
        return self._total - len(self._tiers[_CRITICAL]) < self.shared_cap

    def _victim(self, priority: Priority) -> Waiter | None:
        for p in reversed(ALL_PRIORITIES):
            if p <= priority:
                return None
            if self._tiers[p]:
                return self._tiers[p][0]
        return None


def dispatch(
    queue: PriorityQueue,
    limiter: Limiter,
    now: float,
    deliver: Callable[[Waiter, Permit], bool],
) -> int:
    """Grant free permits to the best waiters; return how many were granted."""
    if not queue._total:  # nobody waits (every release asks): nothing to grant
        return 0
    if limiter._partition is not None:  # ``limiter.partitioned``
        return _dispatch_partitioned(queue, limiter, now, deliver)
    granted = 0
    permit: Permit | None = None
    while queue.total:
        if permit is None:
            permit = limiter.try_acquire(now)
            if permit is None:
                break
        waiter = queue.pop_best()
        if waiter is not None and deliver(waiter, permit):
            granted += 1
            permit = None
    if permit is not None:
        permit.release(_IGNORED, now)
    return granted


def _dispatch_partitioned(
    queue: PriorityQueue,
    limiter: Limiter,
    now: float,
    deliver: Callable[[Waiter, Permit], bool],
) -> int:
    granted = 0
    routes = queue._routes  # waiters per route key (``queued_routes``)
    while queue._total:
        if len(routes) == 1:  # one route waits (the common case): every waiter fits, no scan
            if not limiter.has_capacity(next(iter(routes))):
                break
            waiter = queue.pop_best()
        else:
            room = {route for route in routes if limiter.has_capacity(route)}
            if not room:  # every route with waiters is full: no scan
                break
            waiter = queue.pop_best(_in(room))
        if waiter is None:
            break
        permit = limiter.try_acquire(now, waiter.route)
        if permit is None:  # the global cap: no route can take one now
            queue.push_front(waiter)
            break
        if deliver(waiter, permit):
            granted += 1
        else:
            permit.release(_IGNORED, now)
    return granted


def _in(routes: set[str]) -> Callable[[Waiter], bool]:
    """A ``pop_best`` filter: the waiter's route is one of ``routes``."""
    return lambda waiter: waiter.route in routes
