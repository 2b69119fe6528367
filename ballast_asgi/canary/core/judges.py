"""The rules that decide a rollback from blocks of counts: ours and two baselines.

* ``SequentialJudge`` (``rule: sequential``): two capped mixture e-processes
  (``evidence.py``), one on errors and one on slow requests, each at its share
  of ``alpha`` (``error_share``, 0.8 on errors, 0.2 on latency: a latency
  regression over the stable p99 is a large relative risk, capped at
  ``cap_nats`` a second either way, so a smaller share costs it ~1 s, while
  errors at +5 pp on a 2 % base are a small one whose time is set by
  ``ln(1 / alpha_errors)``). Rolls back when either e-value reaches
  ``1 / alpha_metric``. Anytime-valid: it may look after every block.
* ``FixedHorizonJudge`` (``rule: fixed_horizon``): a one-sided two-proportion
  z-test on errors, once, after ``horizon_s`` (10 minutes), at level ``alpha``.
* ``ThresholdJudge`` (``rule: threshold``, Flagger-like): every ``window_s``
  (60 s) the canary's success rate is checked against ``min_success`` (99 %);
  a window with canary traffic below it is a failed check; ``max_failed``
  (5) failed checks in total roll back. Absolute, so it cannot tell a bad
  canary from a bad day.

The baselines look at errors only. ``may_promote`` tells a ramp whether the
rule has had its say: the fixed horizon only after its test passed (so a ramp
shorter than the horizon waits at its last step instead of promoting untested).
A judge returns a ``Verdict`` (rollback, with the reason and the evidence)
or None (keep going).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any, Literal, Protocol

from ballast_asgi.canary.core.blocks import Block
from ballast_asgi.canary.core.evidence import DEFAULT_PARAMS, EvidenceParams, MixtureEProcess
from ballast_asgi.canary.core.history import Regime, StableHistory

RuleName = Literal["sequential", "fixed_horizon", "threshold"]
RULES: tuple[str, ...] = ("sequential", "fixed_horizon", "threshold")
#: The share of alpha the sequential judge spends on errors (the rest on latency).
ERROR_SHARE = 0.8
#: The per-block cap once the stable history shows no bursts (50 nats: no cap in practice).
CALM_CAP_NATS = 50.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """A decision to roll back: which metric and the numbers behind it."""

    reason: str
    evidence: dict[str, Any]


@dataclass(slots=True)
class Totals:
    """Cumulative counts per version since the canary started."""

    requests_c: int = 0
    requests_s: int = 0
    errors_c: int = 0
    errors_s: int = 0
    slow_c: int = 0
    slow_s: int = 0

    def add(self, b: Block) -> None:
        """Add one block's counts."""
        self.requests_c += b.requests_c
        self.requests_s += b.requests_s
        self.errors_c += b.errors_c
        self.errors_s += b.errors_s
        self.slow_c += b.slow_c
        self.slow_s += b.slow_s

    def as_dict(self) -> dict[str, dict[str, int]]:
        """Counts per version, as the admin endpoint shows them."""
        return {
            "canary": {"requests": self.requests_c, "errors": self.errors_c, "slow": self.slow_c},
            "stable": {"requests": self.requests_s, "errors": self.errors_s, "slow": self.slow_s},
        }


class Judge(Protocol):
    """What the rollout needs from a rule."""

    name: str
    totals: Totals

    def update(self, block: Block) -> Verdict | None:
        """Take one finished block; a verdict when the canary must go."""
        ...

    def statistic(self) -> dict[str, Any]:
        """The current statistic (JSON-safe), for the admin endpoint and the evidence."""
        ...

    def may_promote(self) -> bool:
        """Whether a ramp may promote now (the rule has nothing left to test)."""
        ...


def _share(part: int, other: int) -> float:
    total = part + other
    return part / total if total else 0.0


class SequentialJudge:
    """Anytime-valid: capped mixture e-processes on errors and on slow requests.

    With a ``history`` (the stable instances', ``history.py``) the judge learns,
    once the history suffices, whether events come in bursts; a metric found
    ``calm`` has its cap lifted to ``calm_cap_nats`` from the next block on
    (decided from the past only, so the guarantee for independent errors holds).
    """

    name = "sequential"

    def __init__(
        self,
        *,
        alpha: float = 0.01,
        error_share: float = ERROR_SHARE,
        params: EvidenceParams = DEFAULT_PARAMS,
        history: StableHistory | None = None,
        calm_cap_nats: float = CALM_CAP_NATS,
    ) -> None:
        if not 0.0 < alpha < 1.0 or not 0.0 < error_share < 1.0:
            raise ValueError("alpha and error_share must be in (0, 1)")
        self.alpha = alpha
        self.log_bound_errors = -math.log(alpha * error_share)
        self.log_bound_latency = -math.log(alpha * (1.0 - error_share))
        self.errors = MixtureEProcess(params)
        self.latency = MixtureEProcess(params)
        self.totals = Totals()
        self.history = history
        self.calm_cap_nats = max(calm_cap_nats, params.cap_nats)

    def learn(self, now: float) -> None:
        """Lift a metric's cap if the stable history (complete by ``now``) shows no bursts."""
        if self.history is None:
            return
        regimes = self.history.decide(now)
        for metric, proc in (("errors", self.errors), ("latency", self.latency)):
            if regimes[metric] is Regime.CALM:
                proc.cap_nats = self.calm_cap_nats

    def update(self, block: Block) -> Verdict | None:
        """Add the block to both e-processes; roll back when one crosses its bound."""
        self.totals.add(block)
        q = _share(block.requests_c, block.requests_s)
        self.errors.update(block.errors_c, block.errors_s, q, block.start)
        q_timed = _share(block.timed_c, block.timed_s)
        self.latency.update(block.slow_c, block.slow_s, q_timed, block.start)
        if self.errors.log_e >= self.log_bound_errors:
            return Verdict("errors", self.statistic())
        if self.latency.log_e >= self.log_bound_latency:
            return Verdict("latency", self.statistic())
        self.learn(block.end)
        return None

    def statistic(self) -> dict[str, Any]:
        """Log e-values, their bounds and the leading relative risk per metric."""
        return {
            "rule": self.name,
            "alpha": self.alpha,
            "errors": _eprocess_doc(self.errors, self.log_bound_errors),
            "latency": _eprocess_doc(self.latency, self.log_bound_latency),
            "counts": self.totals.as_dict(),
            "stable_history": None if self.history is None else self.history.snapshot(),
        }

    def may_promote(self) -> bool:
        """Always: the e-process is valid whenever it stops (the ramp decides when)."""
        return True


def _eprocess_doc(proc: MixtureEProcess, bound: float) -> dict[str, Any]:
    return {
        "log_e_value": round(proc.log_e, 4),
        "log_bound": round(bound, 4),
        "blocks_with_evidence": proc.blocks,
        "leading_ratio": round(proc.best_ratio(), 3),
        "cap_nats": proc.cap_nats,
    }


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


def make_judge(
    rule: str,
    *,
    alpha: float = 0.01,
    horizon_s: float = 600.0,
    error_share: float = ERROR_SHARE,
    params: EvidenceParams = DEFAULT_PARAMS,
    history: StableHistory | None = None,
    calm_cap_nats: float = CALM_CAP_NATS,
) -> Judge:
    """The judge for a rule name (``sequential``, ``fixed_horizon``, ``threshold``)."""
    if rule == "sequential":
        return SequentialJudge(alpha=alpha, error_share=error_share, params=params,
                               history=history, calm_cap_nats=calm_cap_nats)  # fmt: skip
    if rule == "fixed_horizon":
        return FixedHorizonJudge(alpha=alpha, horizon_s=horizon_s)
    if rule == "threshold":
        return ThresholdJudge()
    raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")


__all__ = [
    "CALM_CAP_NATS",
    "ERROR_SHARE",
    "RULES",
    "FixedHorizonJudge",
    "Judge",
    "RuleName",
    "SequentialJudge",
    "ThresholdJudge",
    "Totals",
    "Verdict",
    "make_judge",
    "two_proportion_z",
]
