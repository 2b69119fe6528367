"""When to stop asking Redis: the rebuilt breaker and the naive one it replaced.

``RedisBreaker`` (the reference gateway's rebuilt breaker, seed 002):

- *closed*: every call goes to Redis; outcomes are kept for the last
  ``window_s`` (100 ms). It opens when, inside that window, at least
  ``min_failures`` (5) calls failed **and** they are at least
  ``failure_ratio`` (0.5) of all calls.
- *open*: no calls for ``open_s`` (100 ms); the gateway decides on its own share.
- *half-open*: exactly one call goes through; success closes (window cleared),
  failure opens again for ``open_s``.

A failure is an error or a missed deadline (``redis_timeout_ms``).

``NaiveBreaker`` is the first version, kept for the before/after experiment:
after ``misses`` (3) failures in a row it stops asking for ``open_s`` (1 s), then
simply closes again. One slow stretch of three calls is enough to trip it.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


class Breaker(Protocol):
    """What a driver asks before and tells after each Redis call."""

    def allow(self, now: float) -> bool:
        """May a call go to Redis now? (In half-open: claims the one probe.)"""
        ...

    def record(self, ok: bool, now: float) -> None:
        """The outcome of a call that ``allow`` let through."""
        ...

    def state(self, now: float) -> str:
        """closed, open or half_open."""
        ...

    def refusing(self, now: float) -> bool:
        """Would ``allow`` say no now? (Asks without claiming the half-open probe.)"""
        ...


class RedisBreaker:
    """Ratio-and-count breaker over a short sliding window, one probe in half-open."""

    def __init__(
        self,
        *,
        window_s: float = 0.1,
        failure_ratio: float = 0.5,
        min_failures: int = 5,
        open_s: float = 0.1,
    ) -> None:
        self.window_s = window_s
        self.failure_ratio = failure_ratio
        self.min_failures = min_failures
        self.open_s = open_s
        self._calls: deque[tuple[float, bool]] = deque()
        self._failures = 0
        self._state = CLOSED
        self._opened_at = 0.0
        self._probing = False
        self.opened = 0

    def state(self, now: float) -> str:
        """The current state (open turns half-open once ``open_s`` has passed)."""
        if self._state == OPEN and now - self._opened_at >= self.open_s:
            self._state = HALF_OPEN
            self._probing = False
        return self._state

    def refusing(self, now: float) -> bool:
        """Open, or half-open with its one probe out."""
        state = self.state(now)
        return state == OPEN or (state == HALF_OPEN and self._probing)

    def allow(self, now: float) -> bool:
        """Closed: yes. Open: no. Half-open: yes for exactly one caller at a time."""
        state = self.state(now)
        if state == CLOSED:
            return True
        if state == HALF_OPEN and not self._probing:
            self._probing = True
            return True
        return False

    def record(self, ok: bool, now: float) -> None:
        """Count one outcome; may open or close the breaker."""
        state = self.state(now)
        if state == HALF_OPEN:
            self._probing = False
            if ok:
                self._close()
            else:
                self._open(now)
            return
        if state == OPEN:
            return
        self._calls.append((now, ok))
        if not ok:
            self._failures += 1
        self._expire(now)
        total = len(self._calls)
        if self._failures >= self.min_failures and self._failures >= self.failure_ratio * total:
            self._open(now)

    def _expire(self, now: float) -> None:
        calls = self._calls
        while calls and now - calls[0][0] > self.window_s:
            _, ok = calls.popleft()
            if not ok:
                self._failures -= 1

    def _open(self, now: float) -> None:
        self._state = OPEN
        self._opened_at = now
        self._calls.clear()
        self._failures = 0
        self.opened += 1

    def _close(self) -> None:
        self._state = CLOSED
        self._calls.clear()
        self._failures = 0


class NaiveBreaker:
    """The first breaker: ``misses`` failures in a row stop Redis calls for ``open_s``."""

    def __init__(self, *, misses: int = 3, open_s: float = 1.0) -> None:
        self.misses = misses
        self.open_s = open_s
        self._streak = 0
        self._open_until = float("-inf")
        self.opened = 0

    def state(self, now: float) -> str:
        """open while the pause lasts, closed otherwise (it has no half-open)."""
        return OPEN if now < self._open_until else CLOSED

    def refusing(self, now: float) -> bool:
        """While the pause runs."""
        return now < self._open_until

    def allow(self, now: float) -> bool:
        """Any call is allowed unless the pause is running."""
        return now >= self._open_until

    def record(self, ok: bool, now: float) -> None:
        """A success resets the streak; the ``misses``-th failure in a row pauses calls."""
        if ok:
            self._streak = 0
            return
        self._streak += 1
        if self._streak >= self.misses:
            self._streak = 0
            self._open_until = now + self.open_s
            self.opened += 1
