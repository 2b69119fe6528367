"""Passive ejection (outlier detection) from the outcomes of real requests (pure).

Each instance has an ``OutlierState``; one ``OutlierDetector`` holds the
policy and decides for all of them, so it can compare an instance with the
others and cap how many are out at once. Time is passed in as ``now``.

**What counts.** Every settled attempt is a call; a failure is a 5xx, a
connect error, a reset/protocol error or a gateway-side upstream timeout. A
*gateway failure* (connect error, reset, timeout, 502/503/504, not 500) also
feeds the consecutive rule. The request's own deadline running out
(``AttemptOutcome.DEADLINE``) and a client that went away are neutral: they
say nothing about the instance.

**Rule 1, consecutive gateway failures.** ``consecutive_failures`` (default 5)
gateway failures in a row eject the instance at once.

**Rule 2, success rate relative to the others.** Calls and failures are
counted per instance over the trailing ``window_ms`` (default 2 s). Every
``interval_ms`` (default 250 ms), for each instance with at least
``min_requests`` calls (default 20) compared with the pooled counts of the
other instances (at least ``min_requests`` together), the instance is ejected
when both hold::

    sr_others - sr_i >= success_rate_gap                     # default 0.2
    (p_i - p_o) / sqrt(p (1 - p) (1/n_i + 1/n_o)) >= z       # default z = 3

(``p_i``, ``p_o``: failure ratios; ``p``: the pooled ratio; the two-proportion
z-test keeps noise on small counts from ejecting). An instance failing like
all the others is not an outlier: when the whole pool fails, nothing is
ejected (the gateway-wide breaker's business).

**Ejection time** grows with repeated ejections::

    ejection_s = min(max_ejection_ms, base_ejection_ms * k) / 1000

where ``k`` is 1, or one more than the previous ``k`` when the previous
ejection ended less than ``max_ejection_ms`` ago. An ejected instance returns
when its time is up, with its window cleared.

**Cap.** At most ``max(1, floor(max_ejection_percent / 100 * n))`` of the
``n`` instances are ejected at once (default 50 %): an instance that would
exceed it stays in. Panic mode (all instances used when too few are healthy)
is the pool's rule on top of this.

Defaults follow Envoy's ``outlier_detection`` (consecutive gateway failure,
success-rate and failure-percentage ejection, ``base_ejection_time`` times the
number of ejections, ``max_ejection_percent``), with a shorter evaluation
interval and a z-test in place of the standard-deviation rule, which needs
more instances than a small pool has.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ballast_asgi.core.retry_budget import WindowCounts

_CALLS = 0
_FAILURES = 1


@dataclass(frozen=True, slots=True)
class OutlierPolicy:
    """The detector's settings (see the module docstring)."""

    enabled: bool = True
    consecutive_failures: int = 5
    window_ms: int = 2_000
    interval_ms: int = 250
    min_requests: int = 20
    success_rate_gap: float = 0.2
    z: float = 3.0
    base_ejection_ms: int = 5_000
    max_ejection_ms: int = 60_000
    max_ejection_percent: float = 50.0

    def __post_init__(self) -> None:
        checks = (
            ("consecutive_failures", self.consecutive_failures >= 1, ">= 1"),
            ("window_ms", self.window_ms >= 10, ">= 10"),
            ("interval_ms", self.interval_ms >= 1, ">= 1"),
            ("min_requests", self.min_requests >= 1, ">= 1"),
            ("success_rate_gap", 0.0 < self.success_rate_gap <= 1.0, "in (0, 1]"),
            ("z", self.z >= 0.0, ">= 0"),
            ("base_ejection_ms", 1 <= self.base_ejection_ms <= self.max_ejection_ms,
             "in 1..max_ejection_ms"),
            ("max_ejection_percent", 0.0 <= self.max_ejection_percent <= 100.0, "in 0..100"),
        )  # fmt: skip
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"outlier {name} must be {allowed}, got {getattr(self, name)!r}")


class OutlierState:
    """One instance's counts and ejection record."""

    __slots__ = (
        "_window", "body_consecutive", "consecutive", "ejected_until", "ejections", "k",
        "last_ejection_end",
    )  # fmt: skip

    def __init__(self, window_ms: int) -> None:
        self._window = WindowCounts(window_ms / 1000.0, kinds=2)
        self.consecutive = 0
        #: Response bodies cut by the upstream in a row (after heads that looked fine).
        self.body_consecutive = 0
        self.ejected_until = 0.0
        self.ejections = 0
        self.k = 0
        self.last_ejection_end = -math.inf

    def ejected(self, now: float) -> bool:
        """Whether the instance is out of the rotation at ``now``."""
        return now < self.ejected_until

    def counts(self, now: float) -> tuple[int, int]:
        """(calls, failures) in the trailing window."""
        return self._window.total(now, _CALLS), self._window.total(now, _FAILURES)

    def success_rate(self, now: float) -> float | None:
        """Successes / calls in the window, or None without calls."""
        calls, failures = self.counts(now)
        return None if calls == 0 else 1.0 - failures / calls

    def add(self, now: float, failure: bool) -> None:
        self._window.add(now, _CALLS)
        if failure:
            self._window.add(now, _FAILURES)

    def amend_failure(self, now: float) -> None:
        """A call already counted (as a success at its head) failed after all."""
        self._window.add(now, _FAILURES)

    def clear(self) -> None:
        self._window.clear()
        self.consecutive = 0
        self.body_consecutive = 0


class OutlierDetector:
    """Ejects instances by the two rules of the module docstring."""

    def __init__(self, policy: OutlierPolicy | None = None) -> None:
        self.policy = policy if policy is not None else OutlierPolicy()
        self._next_eval = -math.inf

    def new_state(self) -> OutlierState:
        """A fresh state for a new instance."""
        return OutlierState(self.policy.window_ms)

    def record(
        self,
        state: OutlierState,
        states: Sequence[OutlierState],
        now: float,
        *,
        failure: bool,
        gateway_failure: bool,
    ) -> bool:
        """Count one settled call; True when it ejected the instance."""
        if not self.policy.enabled or state.ejected(now):
            return False
        state.add(now, failure)
        state.consecutive = state.consecutive + 1 if gateway_failure else 0
        if state.consecutive >= self.policy.consecutive_failures:
            return self._eject(state, states, now)
        return False

    def record_body(
        self, state: OutlierState, states: Sequence[OutlierState], now: float, *, complete: bool
    ) -> bool:
        """Count how a body after a good head ended; True when it ejected the instance."""
        if not self.policy.enabled or state.ejected(now):
            return False
        if complete:
            state.body_consecutive = 0
            return False
        state.amend_failure(now)
        state.body_consecutive += 1
        if state.body_consecutive >= self.policy.consecutive_failures:
            return self._eject(state, states, now)
        return False

    def evaluate(self, states: Sequence[OutlierState], now: float) -> list[OutlierState]:
        """Run the success-rate rule if an interval has passed; the ones it ejected."""
        if not self.policy.enabled or now < self._next_eval:
            return []
        self._next_eval = now + self.policy.interval_ms / 1000.0
        live = [s for s in states if not s.ejected(now)]
        counts = {id(s): s.counts(now) for s in live}
        ejected: list[OutlierState] = []
        for state in live:
            if self._outlier(counts, state) and self._eject(state, states, now):
                ejected.append(state)
        return ejected

    def _outlier(self, counts: dict[int, tuple[int, int]], state: OutlierState) -> bool:
        n_i, f_i = counts[id(state)]
        n_o = sum(c for k, (c, _) in counts.items() if k != id(state))
        f_o = sum(f for k, (_, f) in counts.items() if k != id(state))
        p = self.policy
        if n_i < p.min_requests or n_o < p.min_requests:
            return False
        return _is_worse(n_i, f_i, n_o, f_o, p.success_rate_gap, p.z)

    def _eject(self, state: OutlierState, states: Sequence[OutlierState], now: float) -> bool:
        out = sum(1 for s in states if s.ejected(now))
        if out >= max_ejected(len(states), self.policy.max_ejection_percent):
            state.consecutive = 0
            return False
        max_s = self.policy.max_ejection_ms / 1000.0
        state.k = state.k + 1 if now - state.last_ejection_end < max_s else 1
        period = min(max_s, self.policy.base_ejection_ms / 1000.0 * state.k)
        state.ejected_until = now + period
        state.last_ejection_end = state.ejected_until
        state.ejections += 1
        state.clear()
        return True


def max_ejected(n: int, percent: float) -> int:
    """How many of ``n`` instances may be ejected at once (always at least one)."""
    return max(1, math.floor(n * percent / 100.0 + 1e-9))


def _is_worse(n_i: int, f_i: int, n_o: int, f_o: int, gap: float, z: float) -> bool:
    p_i, p_o = f_i / n_i, f_o / n_o
    if p_i - p_o < gap:
        return False
    pooled = (f_i + f_o) / (n_i + n_o)
    se = math.sqrt(pooled * (1.0 - pooled) * (1.0 / n_i + 1.0 / n_o))
    return se == 0.0 or (p_i - p_o) / se >= z
