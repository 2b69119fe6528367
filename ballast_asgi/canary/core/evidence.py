"""Anytime-valid evidence that the canary has a higher event rate than stable, in the same period.

The events are errors (5xx, connect failures, timeouts) or slow requests
(latency above the stable version's recent p99). Time is cut into short
blocks (1 s in the gateway). In block ``b`` the canary served ``n_c`` of the
``n = n_c + n_s`` requests, so its share is ``q_b = n_c / n``; ``e_c`` and
``e_s`` events happened on each side.

**Conditioning on the period.** Under H0 (both versions have the same event
probability in the block, whatever that probability is) and a split that does
not look at the outcome, the number of canary events given the block's total
``e = e_c + e_s`` is hypergeometric, which is dominated in the convex order by
``Binomial(e, q_b)`` (Hoeffding 1963). A downstream outage that raises both
versions' error rates changes ``e``, not this conditional law, so it is not
evidence against the canary.

**The alternative** is a relative risk ``r > 1`` (canary events ``r`` times as
likely as stable ones), which makes an event a canary event with probability
``rho = r q / (r q + 1 - q)``. The per-block log likelihood ratio is::

    l_b(r) = e_c ln r - e ln(1 + q_b (r - 1))

**Mixture.** The e-process is a weighted average over a log-spaced grid of
relative risks (``ratio_min`` to ``ratio_max``) of the product of capped block
ratios. The weights fall as ``ln(r)^-prior_power``: the regressions that are
hard to see are the small relative risks (+5 pp on a 2 % base is r = 3.5),
and a large r is so informative that a small weight costs it little time, so
the prior puts its mass where the waiting is (a uniform prior over x2..x250,
the first version, paid ln 12 = 2.5 nats for every effect).

**Cap (burst robustness).** The bound above assumes errors independent
given the period. A version on one instance whose errors come in short
bursts breaks that: a two-second burst on the canary's instance *is* a
regression for two seconds. So what a block may add is bounded::

    c_b(r) = max(cap, l_b^1(r))   if no block in the last ``single_event_gap_s`` used the
                                  one-event allowance at this r, else cap
    M_t = sum_k w_k prod_{b <= t} exp(min(l_b(r_k), c_b(r_k)))

``l_b^1`` is the same block with exactly one canary event: sparse errors at
low traffic count in full, but a clump of them within the gap counts as one
full event plus ``cap`` per further block. ``c_b`` depends on the block's
totals and the past only, and each capped factor is at most the true ratio,
whose conditional expectation is <= 1 under H0 (the convex-order bound
above), so ``M_t`` is a nonnegative supermartingale and Ville's inequality
gives ``P(sup_t M_t >= 1/alpha) <= alpha`` for independent errors: the chance
of a false rollback stays below ``alpha`` however often the judge looks
(mixture SPRT: Robbins 1970; Johari et al. 2017; Lindon et al., KDD 2022).
Under bursts the rate is measured (docs/canary.md), not proved. The cap may
change between blocks (``MixtureEProcess.cap_nats``: the judge lifts it when
the stable instances' history shows no bursts, ``history.py``); a cap fixed
before the block it applies to keeps every factor at most the true ratio, so
the argument above is unchanged.
Blocks with no events or with traffic on one side only add nothing: low
traffic makes the judge wait, never fail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EvidenceParams:
    """The sequential rule's constants (``canary.sequential`` in the config)."""

    #: Smallest and largest relative risk the mixture covers, and how many grid points.
    ratio_min: float = 2.0
    ratio_max: float = 250.0
    ratio_points: int = 12
    #: Prior weight of relative risk r is proportional to ln(r) ** -prior_power (0: uniform).
    prior_power: float = 2.0
    #: Most a block may add to a component's log e-value, in nats (unless one event adds more).
    cap_nats: float = 0.5
    #: The one-event allowance is used at most once per this many seconds (0: every block).
    single_event_gap_s: float = 4.0

    def __post_init__(self) -> None:
        if not 1.0 < self.ratio_min <= self.ratio_max:
            raise ValueError("need 1 < ratio_min <= ratio_max")
        if self.ratio_points < 1 or (self.ratio_points == 1) != (self.ratio_min == self.ratio_max):
            raise ValueError("ratio_points must be >= 2 (1 when ratio_min == ratio_max)")
        if not 0.0 <= self.prior_power <= 8.0:
            raise ValueError(f"prior_power must be in [0, 8], got {self.prior_power}")
        if not self.cap_nats > 0.0:
            raise ValueError(f"cap_nats must be > 0, got {self.cap_nats}")
        if not self.single_event_gap_s >= 0.0:
            raise ValueError(f"single_event_gap_s must be >= 0, got {self.single_event_gap_s}")

    def ratios(self) -> tuple[float, ...]:
        """The log-spaced grid of relative risks."""
        n, lo, hi = self.ratio_points, self.ratio_min, self.ratio_max
        if n == 1:
            return (lo,)
        return tuple(lo * (hi / lo) ** (k / (n - 1)) for k in range(n))

    def log_weights(self) -> tuple[float, ...]:
        """Log prior weights of the grid (they sum to one)."""
        raw = [-self.prior_power * math.log(math.log(r)) for r in self.ratios()]
        norm = log_sum_exp(raw)
        return tuple(w - norm for w in raw)


DEFAULT_PARAMS = EvidenceParams()


def log_sum_exp(values: Sequence[float]) -> float:
    """``ln(sum(exp(v)))`` without overflow."""
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def block_log_ratio(events_c: int, events: int, share_c: float, ratio: float) -> float:
    """``l_b(r)``: the log likelihood ratio of one block at relative risk ``ratio``."""
    return events_c * math.log(ratio) - events * math.log1p(share_c * (ratio - 1.0))


def capped_log_ratio(
    events_c: int,
    events: int,
    share_c: float,
    ratio: float,
    cap_nats: float,
    one_event: bool = True,
) -> float:
    """``min(l_b(r), c_b(r))``: what one block adds at relative risk ``ratio``.

    ``one_event``: whether the one-event allowance is available in this block.
    """
    log_r = math.log(ratio)
    drag = events * math.log1p(share_c * (ratio - 1.0))
    allowed = max(cap_nats, log_r - drag) if one_event else cap_nats
    return min(events_c * log_r - drag, allowed)


class MixtureEProcess:
    """The capped mixture e-process over relative risks for one event kind."""

    __slots__ = ("_last_single", "_log_w", "_sums", "blocks", "cap_nats", "params", "ratios")

    def __init__(self, params: EvidenceParams = DEFAULT_PARAMS) -> None:
        self.params = params
        self.ratios = params.ratios()
        self._log_w = params.log_weights()
        self._sums = [0.0] * len(self.ratios)
        self._last_single = [-math.inf] * len(self.ratios)
        #: Blocks that carried evidence (events on a block with traffic on both sides).
        self.blocks = 0
        #: The per-block cap now (the judge lifts it when the stable history shows no bursts).
        self.cap_nats = params.cap_nats

    def update(self, events_c: int, events_s: int, share_c: float, at: float = 0.0) -> None:
        """Add one block (starting at ``at`` s): events per side, the canary's share of trials."""
        events = events_c + events_s
        if events <= 0 or not 0.0 < share_c < 1.0:
            return
        self.blocks += 1
        cap, gap = self.cap_nats, self.params.single_event_gap_s
        for k, ratio in enumerate(self.ratios):
            free = at - self._last_single[k] >= gap
            add = capped_log_ratio(events_c, events, share_c, ratio, cap, free)
            self._sums[k] += add
            if add > cap:
                self._last_single[k] = at

    @property
    def log_e(self) -> float:
        """The log of the current e-value (0 before any evidence)."""
        if not self.blocks:
            return 0.0
        return log_sum_exp([s + w for s, w in zip(self._sums, self._log_w, strict=True)])

    def best_ratio(self) -> float:
        """The relative risk whose component carries the most evidence (for display)."""
        best = max(range(len(self.ratios)), key=self._sums.__getitem__)
        return self.ratios[best]


__all__ = [
    "DEFAULT_PARAMS",
    "EvidenceParams",
    "MixtureEProcess",
    "block_log_ratio",
    "capped_log_ratio",
    "log_sum_exp",
]
