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
or None (keep going). This module holds the sequential rule and ``make_judge``;
the baselines are in ``baselines.py``, the ``Verdict``, ``Totals`` and ``Judge``
protocol every rule shares in ``verdict.py`` (all importable from here).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from ballast_asgi.canary.core.baselines import FixedHorizonJudge, ThresholdJudge, two_proportion_z
from ballast_asgi.canary.core.blocks import Block
from ballast_asgi.canary.core.evidence import DEFAULT_PARAMS, EvidenceParams, MixtureEProcess
from ballast_asgi.canary.core.history import Regime, StableHistory
from ballast_asgi.canary.core.verdict import Judge, Totals, Verdict

RuleName = Literal["sequential", "fixed_horizon", "threshold"]
RULES: tuple[str, ...] = ("sequential", "fixed_horizon", "threshold")
#: The share of alpha the sequential judge spends on errors (the rest on latency).
ERROR_SHARE = 0.8
#: The per-block cap once the stable history shows no bursts (50 nats: no cap in practice).
CALM_CAP_NATS = 50.0


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
