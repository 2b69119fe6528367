"""The closed breaker's statistics and its trip rule (pure; time is passed in).

Trip (closed -> open), whichever comes first:

* over the trailing ``window_ms`` there were ``calls >= min_calls`` and
  ``failures / calls >= failure_ratio``; or
* ``consecutive_failures`` failures in a row.

Calls and failures are counted in a ``WindowCounts`` ring (the same one the
retry budget uses), so memory is bounded and each result is O(buckets). The
state machine (``core/breaker.py``) feeds results only while closed and
clears the statistics when it closes again.
"""

from __future__ import annotations

from typing import Any

from ballast_asgi.core.retry_budget import WindowCounts

_CALLS = 0
_FAILURES = 1


class TripStats:
    """Calls and failures over the trailing window, the failure streak, and the trip rule."""

    __slots__ = ("_window", "consecutive", "consecutive_failures", "failure_ratio", "min_calls")

    def __init__(
        self, *, window_ms: int, failure_ratio: float, min_calls: int, consecutive_failures: int
    ) -> None:
        check("window_ms", window_ms >= 1, window_ms, ">= 1")
        check("failure_ratio", 0.0 < failure_ratio <= 1.0, failure_ratio, "in (0, 1]")
        check("min_calls", min_calls >= 1, min_calls, ">= 1")
        check("consecutive_failures", consecutive_failures >= 1, consecutive_failures, ">= 1")
        self.failure_ratio = failure_ratio
        self.min_calls = min_calls
        self.consecutive_failures = consecutive_failures
        #: Failures in a row (a success resets it).
        self.consecutive = 0
        self._window = WindowCounts(window_ms / 1000.0, kinds=2)

    def record(self, success: bool, now: float) -> bool:
        """Count one result; True when the breaker must trip."""
        self._window.add(now, _CALLS)
        if success:
            self.consecutive = 0
            return False
        self._window.add(now, _FAILURES)
        self.consecutive += 1
        return self.consecutive >= self.consecutive_failures or self._ratio_tripped(now)

    def clear(self) -> None:
        """Forget every result (the breaker closed)."""
        self._window.clear()
        self.consecutive = 0

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON-safe counts for the breaker's ``/snapshot``."""
        return {
            "window_calls": self._window.total(now, _CALLS),
            "window_failures": self._window.total(now, _FAILURES),
            "consecutive_failures": self.consecutive,
        }

    def _ratio_tripped(self, now: float) -> bool:
        calls = self._window.total(now, _CALLS)
        failures = self._window.total(now, _FAILURES)
        return calls >= self.min_calls and failures >= self.failure_ratio * calls


def check(name: str, ok: bool, value: object, allowed: str) -> None:
    """Raise ``ValueError`` naming the breaker parameter unless ``ok``."""
    if not ok:
        raise ValueError(f"breaker {name} must be {allowed}, got {value!r}")
