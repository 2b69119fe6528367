"""The closed breaker's statistics and its trip rule (pure; time is passed in).

Trip (closed -> open), whichever comes first:

* over the trailing ``window_ms`` there were ``calls >= min_calls`` and
  ``failures / calls >= failure_ratio``; or
* ``consecutive_failures`` failures in a row;

and, so that no single client can open a breaker for everybody else, the
failures must not all be one client's doing. A failure is either

* **shared**: it does not depend on the request (the connection to the
  upstream could not be made); shared failures trip on their own, by the two
  rules above counted over shared failures only; or
* **client-specific** (a 5xx, a timeout, a reset: a request can provoke
  those): the rules above count every failure, but trip only while the
  failures in the window came from at least ``min_failing_clients`` distinct
  client addresses. Those are tracked in a small LRU of at most
  ``min_failing_clients`` addresses with their last failure time (the answer
  "at least K distinct in the window" needs no more), so a flood of invented
  addresses costs nothing. A failure without an address counts as the
  address ``""``. ``min_failing_clients = 1`` is the classic breaker.

Calls and failures are counted in a ``WindowCounts`` ring (the same one the
retry budget uses), so memory is bounded and each result is O(buckets). The
state machine (``core/breaker.py``) feeds results only while closed and
clears the statistics when it closes again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ballast_asgi.core.retry_budget import WindowCounts

_CALLS = 0
_FAILURES = 1
_SHARED = 2


class TripStats:
    """Calls and failures over the trailing window, the failure streak, and the trip rule."""

    __slots__ = (
        "_clients",
        "_window",
        "_window_s",
        "consecutive",
        "consecutive_failures",
        "consecutive_shared",
        "failure_ratio",
        "min_calls",
        "min_failing_clients",
    )

    def __init__(
        self,
        *,
        window_ms: int,
        failure_ratio: float,
        min_calls: int,
        consecutive_failures: int,
        min_failing_clients: int = 1,
    ) -> None:
        check("window_ms", window_ms >= 1, window_ms, ">= 1")
        check("failure_ratio", 0.0 < failure_ratio <= 1.0, failure_ratio, "in (0, 1]")
        check("min_calls", min_calls >= 1, min_calls, ">= 1")
        check("consecutive_failures", consecutive_failures >= 1, consecutive_failures, ">= 1")
        check("min_failing_clients", min_failing_clients >= 1, min_failing_clients, ">= 1")
        self.failure_ratio = failure_ratio
        self.min_calls = min_calls
        self.consecutive_failures = consecutive_failures
        self.min_failing_clients = min_failing_clients
        #: Failures in a row (a success resets it).
        self.consecutive = 0
        #: Shared failures in a row (a success resets it; client failures do not).
        self.consecutive_shared = 0
        self._window_s = window_ms / 1000.0
        self._window = WindowCounts(self._window_s, kinds=3)
        #: The most recent distinct failing clients (at most min_failing_clients), by last failure.
        self._clients: OrderedDict[str, float] = OrderedDict()

    def record(
        self, success: bool, now: float, *, client: str | None = None, shared: bool = False
    ) -> bool:
        """Count one result; True when the breaker must trip.

        ``client``: the failing request's client address; ``shared``: the failure
        does not depend on the request (connect error), so it counts for everybody.
        """
        self._window.add(now, _CALLS)
        if success:
            self.consecutive = 0
            self.consecutive_shared = 0
            return False
        self._window.add(now, _FAILURES)
        self.consecutive += 1
        if shared:
            self._window.add(now, _SHARED)
            self.consecutive_shared += 1
            if self.consecutive_shared >= self.consecutive_failures or self._ratio_tripped(
                now, _SHARED
            ):
                return True
        else:
            self._note_client(client or "", now)
        tripped = self.consecutive >= self.consecutive_failures or self._ratio_tripped(
            now, _FAILURES
        )
        return tripped and self.failing_clients(now) >= self.min_failing_clients

    def failing_clients(self, now: float) -> int:
        """Distinct clients with a failure in the window (counted up to min_failing_clients)."""
        clients = self._clients
        horizon = now - self._window_s
        while clients:
            oldest = next(iter(clients.values()))
            if oldest > horizon:
                break
            clients.popitem(last=False)
        return len(clients)

    def _note_client(self, client: str, now: float) -> None:
        clients = self._clients
        clients[client] = now
        clients.move_to_end(client)
        while len(clients) > self.min_failing_clients:
            clients.popitem(last=False)

    def clear(self) -> None:
        """Forget every result (the breaker closed)."""
        self._window.clear()
        self._clients.clear()
        self.consecutive = 0
        self.consecutive_shared = 0

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON-safe counts for the breaker's ``/snapshot``."""
        return {
            "window_calls": self._window.total(now, _CALLS),
            "window_failures": self._window.total(now, _FAILURES),
            "window_shared_failures": self._window.total(now, _SHARED),
            "consecutive_failures": self.consecutive,
            "failing_clients": self.failing_clients(now),
            "min_failing_clients": self.min_failing_clients,
        }

    def _ratio_tripped(self, now: float, kind: int) -> bool:
        calls = self._window.total(now, _CALLS)
        failures = self._window.total(now, kind)
        return calls >= self.min_calls and failures >= self.failure_ratio * calls


def check(name: str, ok: bool, value: object, allowed: str) -> None:
    """Raise ``ValueError`` naming the breaker parameter unless ``ok``."""
    if not ok:
        raise ValueError(f"breaker {name} must be {allowed}, got {value!r}")
