"""The gateway's own event-loop lag, estimated from a periodic tick (pure).

A response that arrives while the gateway's event loop is busy sits in its
socket until the loop gets round to it, and that wait is inside the RTT the
limiter samples. A gradient controller reads it as backend queueing and cuts
the limit, which keeps the backend idle exactly when the gateway is busiest
(ADR 0010). This core measures that wait the same way the response suffers
it: a callback due every ``period_s`` runs late by however long the loop was
busy with other work; the lateness of the ticks is the loop lag.

``tick(now)`` is called by the driver (``ballast_asgi.telemetry.loop_lag``) each time
the tick callback runs; ``estimate(now)`` is the lag to take out of an RTT
sampled at ``now``: an exponentially weighted mean of recent tick lateness,
or the lateness of the tick that is overdue right now, whichever is larger
(a loop that has been stuck for 30 ms since the last tick was due is 30 ms
late for every response it is only now handing over).
"""

from __future__ import annotations

#: Tick period of the driver, seconds: 200 callbacks a second cost ~0.1 % of a core.
DEFAULT_PERIOD_S = 0.005
#: Weight of the newest tick in the mean (at 5 ms ticks: a ~25 ms memory).
DEFAULT_ALPHA = 0.2


class LoopLag:
    """Event-loop lag from the lateness of a periodic tick; time comes in as numbers."""

    __slots__ = ("_mean_s", "_next_due", "alpha", "period_s", "ticks")

    def __init__(self, period_s: float = DEFAULT_PERIOD_S, alpha: float = DEFAULT_ALPHA) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.period_s = period_s
        self.alpha = alpha
        self.ticks = 0
        self._mean_s = 0.0
        self._next_due: float | None = None

    def tick(self, now: float) -> None:
        """The tick callback ran at ``now``; the next one is due ``period_s`` later."""
        due = self._next_due
        if due is not None:
            late = now - due if now > due else 0.0
            self._mean_s += self.alpha * (late - self._mean_s)
            self.ticks += 1
        self._next_due = now + self.period_s

    def estimate(self, now: float) -> float:
        """Seconds of loop lag in a response handled at ``now`` (0 before the first tick)."""
        due = self._next_due
        if due is None:
            return 0.0
        overdue = now - due
        return overdue if overdue > self._mean_s else self._mean_s

    @property
    def mean_s(self) -> float:
        """The weighted mean tick lateness."""
        return self._mean_s
