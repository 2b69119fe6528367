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

**Mixture and cap.** The e-process is the average over a log-spaced grid of
relative risks (uniform prior, x2 to x250) of the product of capped block
ratios::

    c_b(r) = max(cap, l_b^1(r))     l_b^1: the same block with exactly one canary event
    M_t = (1/K) sum_k prod_{b <= t} exp(min(l_b(r_k), c_b(r_k)))

A block may add at most ``cap`` nats (0.6), or what a single canary event
would add when that is more (so sparse errors at low traffic count in full).
Each capped factor is at most the true ratio, whose conditional expectation is
<= 1 under H0 (the convex-order bound above), so ``M_t`` is a nonnegative supermartingale
and Ville's inequality gives ``P(sup_t M_t >= 1/alpha) <= alpha``: the chance
of a false rollback stays below ``alpha`` however often the judge looks
(mixture SPRT: Robbins 1970; Johari et al. 2017; Lindon et al., KDD 2022).
The cap bounds what any one block can add, so a
short per-instance error burst on the canary (which breaks the independence
the bound assumes) has to persist for several blocks before it counts.
Blocks with no events or with traffic on one side only add nothing: low
traffic makes the judge wait, never fail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: Relative risks the mixture covers by default (x2 to x250, 12 points, log-spaced).
DEFAULT_RATIOS: tuple[float, ...] = tuple(2.0 * (125.0 ** (k / 11)) for k in range(12))
#: Most a single block may add to the log e-value, in nats (unless one event adds more).
DEFAULT_CAP_NATS = 0.6


def log_sum_exp(values: Sequence[float]) -> float:
    """``ln(sum(exp(v)))`` without overflow."""
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def block_log_ratio(events_c: int, events: int, share_c: float, ratio: float) -> float:
    """``l_b(r)``: the log likelihood ratio of one block at relative risk ``ratio``."""
    return events_c * math.log(ratio) - events * math.log1p(share_c * (ratio - 1.0))


def capped_log_ratio(
    events_c: int, events: int, share_c: float, ratio: float, cap_nats: float
) -> float:
    """``min(l_b(r), max(cap, l_b^1(r)))``: what one block adds at relative risk ``ratio``."""
    log_r = math.log(ratio)
    drag = events * math.log1p(share_c * (ratio - 1.0))
    return min(events_c * log_r - drag, max(cap_nats, log_r - drag))


class MixtureEProcess:
    """The capped mixture e-process over relative risks for one event kind."""

    __slots__ = ("_log_k", "_sums", "blocks", "cap_nats", "ratios")

    def __init__(
        self, ratios: tuple[float, ...] = DEFAULT_RATIOS, cap_nats: float = DEFAULT_CAP_NATS
    ) -> None:
        if not ratios or min(ratios) <= 1.0:
            raise ValueError("ratios must be a non-empty tuple of relative risks above 1")
        if not cap_nats > 0.0:
            raise ValueError(f"cap_nats must be > 0, got {cap_nats}")
        self.ratios = ratios
        self.cap_nats = cap_nats
        self._sums = [0.0] * len(ratios)
        self._log_k = math.log(len(ratios))
        #: Blocks that carried evidence (events on a block with traffic on both sides).
        self.blocks = 0

    def update(self, events_c: int, events_s: int, share_c: float) -> None:
        """Add one block: events on each side and the canary's share of the block's trials."""
        events = events_c + events_s
        if events <= 0 or not 0.0 < share_c < 1.0:
            return
        self.blocks += 1
        cap = self.cap_nats
        for k, ratio in enumerate(self.ratios):
            self._sums[k] += capped_log_ratio(events_c, events, share_c, ratio, cap)

    @property
    def log_e(self) -> float:
        """The log of the current e-value (0 before any evidence)."""
        return log_sum_exp(self._sums) - self._log_k

    def best_ratio(self) -> float:
        """The relative risk whose component carries the most evidence (for display)."""
        best = max(range(len(self.ratios)), key=self._sums.__getitem__)
        return self.ratios[best]


__all__ = [
    "DEFAULT_CAP_NATS",
    "DEFAULT_RATIOS",
    "MixtureEProcess",
    "block_log_ratio",
    "capped_log_ratio",
    "log_sum_exp",
]
