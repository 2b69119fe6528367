"""The two baseline rules the sequential judge is measured against (errors only).

* ``FixedHorizonJudge`` (``rule: fixed_horizon``): a one-sided two-proportion
  z-test on errors (``two_proportion_z``), once, after ``horizon_s`` (10
  minutes), at level ``alpha``. ``may_promote`` only once that test ran, so a
  ramp shorter than the horizon waits at its last step instead of promoting
  untested.
* ``ThresholdJudge`` (``rule: threshold``, Flagger-like): every ``window_s``
  (60 s) the canary's success rate is checked against ``min_success`` (99 %);
  a window with canary traffic below it is a failed check; ``max_failed`` (5)
  failed checks in total roll back.

``judges.py`` describes all three rules and builds them (``make_judge``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from ballast_asgi.canary.core.blocks import Block
from ballast_asgi.canary.core.verdict import Totals, Verdict


@dataclass(slots=True)
class FixedHorizonJudge:
    """One two-proportion z-test on errors after ``horizon_s`` seconds."""

    alpha: float = 0.01
    horizon_s: float = 600.0
    name: str = "fixed_horizon"
    totals: Totals = field(default_factory=Totals)
    started: float | None = None
    z: float | None = None

    def update(self, block: Block) -> Verdict | None:
        """Count; at the horizon, test once (later blocks only count)."""
        self.totals.add(block)
        if self.started is None:
            self.started = block.start
        if self.z is not None or block.end - self.started < self.horizon_s:
            return None
        t = self.totals
        self.z = two_proportion_z(t.errors_c, t.requests_c, t.errors_s, t.requests_s)
        if self.z >= NormalDist().inv_cdf(1.0 - self.alpha):
            return Verdict("errors", self.statistic())
        return None

    def statistic(self) -> dict[str, Any]:
        """The z statistic (None before the horizon) and its critical value."""
        return {
            "rule": self.name,
            "alpha": self.alpha,
            "horizon_s": self.horizon_s,
            "z": None if self.z is None else round(self.z, 4),
            "z_critical": round(NormalDist().inv_cdf(1.0 - self.alpha), 4),
            "counts": self.totals.as_dict(),
        }

    def may_promote(self) -> bool:
        """Only once the test at the horizon ran (and did not roll back)."""
        return self.z is not None


def two_proportion_z(errors_c: int, n_c: int, errors_s: int, n_s: int) -> float:
    """The pooled two-proportion z statistic (canary minus stable); 0 when undefined."""
    if n_c == 0 or n_s == 0:
        return 0.0
    pooled = (errors_c + errors_s) / (n_c + n_s)
    var = pooled * (1.0 - pooled) * (1.0 / n_c + 1.0 / n_s)
    if var <= 0.0:
        return 0.0
    return (errors_c / n_c - errors_s / n_s) / math.sqrt(var)


@dataclass(slots=True)
class ThresholdJudge:
    """Flagger-like: canary success rate under ``min_success`` in a window is a failed check."""

    window_s: float = 60.0
    min_success: float = 0.99
    max_failed: int = 5
    name: str = "threshold"
    totals: Totals = field(default_factory=Totals)
    failed_checks: int = 0
    checks: int = 0
    _window_start: float | None = None
    _requests: int = 0
    _errors: int = 0

    def update(self, block: Block) -> Verdict | None:
        """Count the canary; at each window's end, check it."""
        self.totals.add(block)
        if self._window_start is None:
            self._window_start = block.start
        self._requests += block.requests_c
        self._errors += block.errors_c
        if block.end - self._window_start < self.window_s:
            return None
        self._window_start = block.end
        requests, errors, self._requests, self._errors = self._requests, self._errors, 0, 0
        if requests == 0:
            return None  # no canary traffic in the window: no check (generous to the baseline)
        self.checks += 1
        self.failed_checks += 1 - errors / requests < self.min_success
        if self.failed_checks >= self.max_failed:
            return Verdict("errors", self.statistic())
        return None

    def statistic(self) -> dict[str, Any]:
        """Checks made and failed so far."""
        return {
            "rule": self.name,
            "window_s": self.window_s,
            "min_success": self.min_success,
            "failed_checks": self.failed_checks,
            "max_failed": self.max_failed,
            "checks": self.checks,
            "counts": self.totals.as_dict(),
        }

    def may_promote(self) -> bool:
        """Always: like Flagger, the ramp's step time is its promotion schedule."""
        return True


__all__ = ["FixedHorizonJudge", "ThresholdJudge", "two_proportion_z"]
