"""Client-side adaptive throttling (pure; Google SRE book, "Handling Overload").

Each client keeps, per backend and over a trailing window, two counts:

* ``requests``: calls the application attempted (including those this
  throttle refused locally), and
* ``accepts``: calls the backend accepted (answered with anything but an
  overload refusal; see ``policy.Verdict``).

A new call is refused locally, before it is sent, with probability::

    p = max(0, (requests - K * accepts) / (requests + 1))

With ``K = 2`` the client keeps sending while at least half of its calls are
accepted, and beyond that lets through about ``K * accepts``: the backend
still sees a little more than it accepts (so the client learns when it
recovers) but not the full offered load. A lower K is more aggressive.

Two departures from the book: the window is ``window_ms`` (default 10 s,
the book uses two minutes; shorter reacts faster after a recovery), and no
call is refused while the window holds fewer than ``min_requests``
requests (a single failure would otherwise refuse half the next calls).

Counts live in ``WindowCounts`` ring buckets (O(buckets) per call, bounded
memory). Time is ``now`` (monotonic seconds); randomness an injected
``random.Random``.
"""

from __future__ import annotations

import random

from ballast_asgi.core.retry_budget import WindowCounts

_REQUESTS = 0
_ACCEPTS = 1


class AdaptiveThrottle:
    """The SRE book's local rejection rule over a trailing window."""

    __slots__ = ("_window", "k", "min_requests")

    def __init__(self, *, k: float = 2.0, window_ms: int = 10_000, min_requests: int = 10) -> None:
        if not k >= 1.0:
            raise ValueError(f"k must be >= 1, got {k}")
        if not min_requests >= 0:
            raise ValueError(f"min_requests must be >= 0, got {min_requests}")
        self.k = k
        self.min_requests = min_requests
        self._window = WindowCounts(window_ms / 1000.0, kinds=2)

    def requests(self, now: float) -> int:
        """Requests attempted in the window."""
        return self._window.total(now, _REQUESTS)

    def accepts(self, now: float) -> int:
        """Requests the backend accepted in the window."""
        return self._window.total(now, _ACCEPTS)

    def reject_probability(self, now: float) -> float:
        """``max(0, (requests - K * accepts) / (requests + 1))``; 0 below ``min_requests``."""
        requests = self.requests(now)
        if requests < self.min_requests:
            return 0.0
        return max(0.0, (requests - self.k * self.accepts(now)) / (requests + 1))

    def admit(self, now: float, rng: random.Random) -> bool:
        """Count one attempted request; False when it is refused locally."""
        p = self.reject_probability(now)
        self._window.add(now, _REQUESTS)
        return p <= 0.0 or rng.random() >= p

    def record_accept(self, now: float) -> None:
        """Count one request the backend accepted."""
        self._window.add(now, _ACCEPTS)
