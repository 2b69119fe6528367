"""Exploration: let the stable side calibrate the burst allowance (an empirical null).

    python -m experiments.canary.empirical_null [--trials 200]

Not the judge's rule: the variants below were tried as a replacement for the
fixed per-block cap and did not meet the speed target and the false-rollback
target at once (numbers and reasons in docs/canary.md). The module keeps them
reproducible.

**Dispersion from the stable side.** The gateway sees the stable version's
errors per block in the same period. From the blocks before ``t`` (the last
``history`` of them, predictable), windows of ``window`` blocks give the
stable error rate's excess variance over binomial (method of moments)::

    tau2 = max(0, sum_j[(E_j - N_j p)^2 - N_j p (1 - p)] / sum_j N_j^2),  rho = tau2 / (p (1 - p))

``rho`` is the intra-window correlation of the stable *aggregate*; a canary
on one instance, against stable spread evenly over ``instances`` independent
ones, fluctuates ``instances`` times as much. The quasi-likelihood (variance
inflation) factor of block ``t``, with ``q`` the canary's share and ``n`` the
block's requests, is the share-weighted mix of both sides' factors::

    phi_t = (1 - q) (1 + (W n_c - 1) k rho) + q (1 + (W n_s - 1) rho)

Variants: ``quasi`` divides each block's gain and the cap by ``phi_t`` (a
larger cap while the stable side is calm); ``switch`` uses the large cap
while ``phi_t`` is under a threshold and the default cap otherwise. Both may
use the default cap for a warm-up (the stable side has shown nothing yet).
Dividing by ``phi_t >= 1`` known before the block keeps every factor's
conditional expectation at most one (Jensen), so for independent errors the
guarantee would survive; the question was only the bursty cells.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ballast_asgi.canary.core.evidence import DEFAULT_PARAMS
from ballast_asgi.canary.core.judges import ERROR_SHARE
from experiments.canary import rules
from experiments.canary.model import NONE, REGRESSIONS, STABLE_INSTANCES, Blocks, Cell, simulate
from experiments.canary.sim import BASE_ERRORS, RPS, SHARES, _seed


def _roll(x: np.ndarray, width: int) -> np.ndarray:
    """Sum of ``x[..., t - width + 1 .. t]`` at every ``t`` (shorter at the start)."""
    c = np.cumsum(x, axis=1, dtype=np.float64)
    out = c.copy()
    out[:, width:] = c[:, width:] - c[:, :-width]
    return out


def dispersion(
    n_c: np.ndarray,
    n_s: np.ndarray,
    e_s: np.ndarray,
    *,
    window: int = 5,
    history: int = 300,
    instances: float = STABLE_INSTANCES,
) -> np.ndarray:
    """``phi_t`` per trial and block from the stable blocks before ``t`` (1 without history)."""
    big_n, big_e = _roll(n_s.astype(np.float64), window), _roll(e_s.astype(np.float64), window)
    big_n[:, : window - 1] = 0.0
    big_e[:, : window - 1] = 0.0
    span = history - window + 1

    def past(x: np.ndarray) -> np.ndarray:
        out = np.zeros_like(x)
        out[:, 1:] = _roll(x, span)[:, :-1]
        return out

    s_n, s_e, s_nn = past(big_n), past(big_e), past(big_n * big_n)
    s_en, s_ee = past(big_e * big_n), past(big_e * big_e)
    p = np.divide(s_e, s_n, out=np.zeros_like(s_e), where=s_n > 0)
    var = p * (1.0 - p)
    excess = s_ee - 2.0 * p * s_en + p * p * s_nn - var * s_n
    tau2 = np.divide(excess, s_nn, out=np.zeros_like(excess), where=s_nn > 0)
    rho = np.clip(np.divide(tau2, var, out=np.zeros_like(tau2), where=var > 0), 0.0, None)
    q = rules._share(n_c, n_s)
    phi_c = 1.0 + np.maximum(window * n_c - 1.0, 0.0) * rho * instances
    phi_s = 1.0 + np.maximum(window * n_s - 1.0, 0.0) * rho
    phi: np.ndarray = (1.0 - q) * phi_c + q * phi_s
    return phi


#: Trials per cell (the variants' spread is far larger than this sample's).
TRIALS = 200


@dataclass(frozen=True)
class Variant:
    """How the stable side's dispersion sets each block's cap (and divides its gain)."""

    name: str
    mode: str  # "default" | "quasi" | "switch"
    cap_calm: float = 1.5
    warm_s: int = 0
    switch_at: float = 1.1


VARIANTS = (
    Variant(f"default (cap {DEFAULT_PARAMS.cap_nats:g})", "default"),
    Variant("quasi-likelihood, cap 1.5 / phi", "quasi"),
    Variant("quasi-likelihood, cap 1.5 / phi, 30 s warm-up at 0.6", "quasi", warm_s=30),
    Variant("cap 1.5 while phi < 1.1, else 0.6", "switch"),
    Variant("cap 1.5 while phi < 1.1, else 0.6, 10 s warm-up", "switch", warm_s=10),
)


def _caps(v: Variant, phi: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    low = DEFAULT_PARAMS.cap_nats
    warm = np.broadcast_to(np.arange(phi.shape[1])[None, :] < v.warm_s, phi.shape)
    if v.mode == "quasi":
        return np.where(warm, low, v.cap_calm), np.where(warm, 1.0, phi)
    if v.mode == "switch":
        return np.where(warm | (phi >= v.switch_at), low, v.cap_calm), None
    return np.full(phi.shape, low), None


def judge(v: Variant, b: Blocks, alpha: float = 0.01) -> np.ndarray:
    """Rollback times under variant ``v`` (errors and slow requests, as the judge splits alpha)."""
    out = []
    for e_c, e_s, n_c, n_s, share in (
        (b.errors_c, b.errors_s, b.requests_c, b.requests_s, ERROR_SHARE),
        (b.slow_c, b.slow_s, b.timed_c, b.timed_s, 1.0 - ERROR_SHARE),
    ):
        caps, scale = _caps(v, dispersion(n_c, n_s, e_s))
        q = rules._share(n_c, n_s)
        bound = -math.log(alpha * share)
        out.append(rules._crossing(e_c, e_s, q, bound, DEFAULT_PARAMS, caps, scale))
    first: np.ndarray = np.minimum(*out)
    return first


@dataclass(frozen=True)
class Row:
    """One variant's numbers."""

    variant: str
    worst_bursty: float
    worst_cell: Cell
    pooled_bursty: float
    #: Median seconds to roll back +5 pp on a 2 % base, per (rps, share).
    pp5_median_s: dict[tuple[int, float], float]


def explore(trials: int, seed: int) -> list[Row]:
    """Per variant: worst and pooled bursty false rollbacks (24 cells), +5 pp medians."""
    h0 = [Cell(r, s, b, model="bursty") for r in RPS for s in SHARES for b in BASE_ERRORS]
    h1 = [Cell(r, s, 0.02) for r in RPS for s in SHARES]
    h0_blocks = [simulate(c, NONE, trials, 600, np.random.default_rng(_seed(seed, "en", c)))
                 for c in h0]  # fmt: skip
    h1_blocks = [simulate(c, REGRESSIONS[0], trials, 300,
                          np.random.default_rng(_seed(seed, "en", c))) for c in h1]  # fmt: skip
    rows = []
    for v in VARIANTS:
        rates = [float(np.isfinite(judge(v, b)).mean()) for b in h0_blocks]
        worst = max(range(len(h0)), key=rates.__getitem__)
        meds = {(c.rps, c.share): float(np.median(judge(v, b)))
                for c, b in zip(h1, h1_blocks, strict=True)}  # fmt: skip
        rows.append(Row(v.name, rates[worst], h0[worst], sum(rates) / len(rates), meds))
    return rows


def render(rows: list[Row]) -> str:
    """A markdown table of ``explore``'s rows."""
    cols = list(rows[0].pp5_median_s)
    head = " | ".join(f"+5 pp, {rps} rps, {100 * share:g} %" for rps, share in cols)
    out = [f"| variant | worst bursty false rollbacks | cell | pooled bursty | {head} |",
           "| --- | --- | --- | --- |" + " --- |" * len(cols)]  # fmt: skip
    for r in rows:
        c = r.worst_cell
        cell = f"{c.rps} rps, {100 * c.share:g} % share, {100 * c.base_error:g} % base"
        meds = " | ".join(f"{r.pp5_median_s[k]:.0f} s" for k in cols)
        out.append(f"| {r.variant} | {100 * r.worst_bursty:.1f} % | {cell} | "
                   f"{100 * r.pooled_bursty:.2f} % | {meds} |")  # fmt: skip
    return "\n".join(out)


SECTION = """## The stable side as the burst model, cold (an empirical null, not adopted)

The judge has no model of bursts. In the bursty model the stable version's
four instances burst exactly as the canary's one does (each its own ON/OFF
chain), and the gateway sees the stable side's errors in the same period, so
the stable side could calibrate the burst allowance.
`experiments/canary/empirical_null.py` estimates, from the stable blocks
*before* each block (the last 300 s, in 5 s windows), the excess variance of
the stable error rate over binomial, scales it to one instance (x4: stable is
four independent instances, the canary one) and turns it into the
quasi-likelihood factor phi of the canary's count in a window (variance
inflation, share-weighted with the stable side's own). phi is 1 for
independent errors; in the bursty cells its median runs from 1.0-1.3 (200 rps,
1 % share) to about 80 (2,000 rps, 25 % share, 2 % base). Dividing a block's
gain by a phi >= 1 known before the block keeps each factor's conditional
expectation at most one (Jensen), so for independent errors the guarantee
would hold. Variants, judged on the same seeded blocks ({trials} trials per
cell; the bursty cells without outage; +5 pp on a 2 % base, median seconds):

{table}

None meets the 2,000 rps speed target and the false-rollback target together
(the variants without a warm-up are the fastest and still take 11 s at a 1 %
share, with several times the default's false rollbacks), for two reasons
that tuning does not remove. *The stable side shows bursts
only after they happen*: with 5 % ON time in 2 s spells, the four stable
instances show no burst at all in the first 10 s of about a quarter of the
bursty trials (0.95^4 e^-1.05 = 0.28), and a rule that must catch +5 pp in 10 s
has to allow the large cap from the first second, when a canary burst is
indistinguishable from the regression; a warm-up at the small cap gives the
seconds back (the warm-up rows) and still leaves more false rollbacks than the
default. *At low canary traffic phi is near 1 by construction* (a few canary
requests per window: overdispersion barely changes a small count's variance),
yet there clumps are what roll good canaries back: a cap above what one error
adds switches the one-event gap off, and every clumped error counts in full
(the 200 rps cells of the first and third rows). A per-instance comparison
(the canary as one more instance, judged as an outlier) has both limits and
at a 1 % share compares 2 requests a second with instances serving 50; it was
not built. The default keeps the fixed cap and the one-event gap.
"""


#: The section as measured in the session that tried it (cold start, old bounds: cap 0.6 nats,
#: one-event gap 2 s; 200 trials per cell), shown when a run does not re-explore (``--explore``).
_KEYS = [(r, sh) for r in RPS for sh in SHARES]
PREVIOUS_ROWS = [
    Row(name, worst / 100, Cell(rps, share / 100, base / 100, model="bursty"), pooled / 100,
        dict(zip(_KEYS, map(float, meds), strict=True)))
    for name, worst, (rps, share, base), pooled, meds in (
        ("default (cap 0.6)", 1.5, (200, 5, 1), 0.42, (96, 33, 13, 21, 10, 9)),
        ("quasi-likelihood, cap 1.5 / phi", 5.5, (200, 25, 0.5), 2.44, (78, 20, 7, 11, 4, 4)),
        ("quasi-likelihood, cap 1.5 / phi, 30 s warm-up at 0.6", 3.5, (200, 5, 1), 0.77,
         (86, 32, 13, 21, 10, 9)),
        ("cap 1.5 while phi < 1.1, else 0.6", 6.0, (200, 25, 0.5), 2.08, (78, 20, 7, 11, 4, 4)),
        ("cap 1.5 while phi < 1.1, else 0.6, 10 s warm-up", 4.5, (200, 25, 0.5), 1.08,
         (79, 24, 12, 16, 10, 9)),
    )
]  # fmt: skip

PREVIOUS = SECTION.replace(
    "Variants, judged on the same seeded blocks",
    "Measured before the warm start (cold start, the old bounds: cap 0.6 nats, one-event gap "
    "2 s; `python -m experiments.canary --explore` re-runs it with today's defaults). "
    "Variants, judged on the same seeded blocks",
).format(trials=TRIALS, table=render(PREVIOUS_ROWS)) + (
    "\nThe warm start (above) is what replaced it: the stable history before the canary "
    "began removes the first reason, and leaving the low-traffic cells on the bounds "
    "(`min_events`) the second.\n"
)


def section(rows: list[Row]) -> str:
    """The docs section: what was tried, the table and why it was not adopted."""
    return SECTION.format(trials=TRIALS, table=render(rows))


def main(argv: Sequence[str] | None = None) -> int:
    """Run every variant on the same seeded blocks and print the table."""
    p = argparse.ArgumentParser(prog="python -m experiments.canary.empirical_null")
    p.add_argument("--trials", type=int, default=TRIALS)
    p.add_argument("--seed", type=int, default=20261201)
    args = p.parse_args(argv)
    print(render(explore(args.trials, args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
