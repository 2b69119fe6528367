"""Traffic and failure models for the simulation: blocks of counts, vectorised over trials.

One block is one second. Each trial draws, per block, the total requests
(Poisson at ``rps``), the canary's share of them (Binomial at ``share``), the
errors on each side from each side's error probability in that second, and
the slow requests among the successes from each side's probability of
exceeding the stable version's p99 (1 % for stable by definition).

Error models:

* ``independent``: every request fails with the base probability.
* ``bursty``: every instance (4 stable, 1 canary) runs a two-state Markov
  chain per second: ON 5 % of the time with a mean ON spell of ``mean_on_s``
  (2 s), failing at 10x the base rate while ON and at the rate that keeps the
  long-run mean at the base rate while OFF. The stable side's probability in
  a second is the mean over its instances (traffic spread evenly).
* ``outage`` (added to either): 30 s starting at a uniform time in
  [30 s, 570 s) during which half of all requests fail on both versions.

Latency: log-normal, median 25 ms, sigma 0.5. Regressions: ``+50 ms`` on every
canary request; ``slow tail``: 10 % of canary requests 4x slower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

OUTAGE_S = 30
OUTAGE_ERROR = 0.5
STABLE_INSTANCES = 4
BURST_ON_SHARE = 0.05
BURST_FACTOR = 10.0
MEAN_ON_S = 2.0
LAT_MEDIAN_S = 0.025
LAT_SIGMA = 0.5
P99 = 0.99


@dataclass(frozen=True)
class Cell:
    """One condition: traffic, canary share, base error, outage or not, error model."""

    rps: int
    share: float
    base_error: float
    outage: bool = False
    model: str = "independent"


@dataclass(frozen=True)
class Regression:
    """How the canary differs from stable (all zero: an identical canary)."""

    name: str = "none"
    add_error: float = 0.0
    error_factor: float = 1.0
    add_latency_s: float = 0.0
    slow_tail: float = 0.0
    slow_factor: float = 4.0

    def canary_error(self, base: float) -> float:
        """The canary's error probability outside outages."""
        return min(1.0, base * self.error_factor + self.add_error)

    def canary_slow(self) -> float:
        """The canary's probability of exceeding the stable p99 (stable's is 1 %)."""
        norm = NormalDist()
        t99 = LAT_MEDIAN_S * math.exp(LAT_SIGMA * norm.inv_cdf(P99))

        def exceed(scale: float, add: float) -> float:
            limit = (t99 - add) / scale
            if limit <= 0:
                return 1.0
            return 1.0 - norm.cdf(math.log(limit / LAT_MEDIAN_S) / LAT_SIGMA)

        body = exceed(1.0, self.add_latency_s)
        return (1 - self.slow_tail) * body + self.slow_tail * exceed(self.slow_factor, 0.0)


NONE = Regression()
REGRESSIONS = (
    Regression("+5 pp errors", add_error=0.05),
    Regression("2x base errors", error_factor=2.0),
    Regression("+50 ms latency", add_latency_s=0.050),
    Regression("10% slow tail", slow_tail=0.10),
)


@dataclass
class Blocks:
    """Counts per trial and second, arrays of shape (trials, seconds)."""

    requests_c: np.ndarray
    requests_s: np.ndarray
    errors_c: np.ndarray
    errors_s: np.ndarray
    timed_c: np.ndarray
    timed_s: np.ndarray
    slow_c: np.ndarray
    slow_s: np.ndarray


def _chains(rng: np.random.Generator, shape: tuple[int, ...], seconds: int) -> np.ndarray:
    """ON/OFF states (bool) of independent two-state chains, stationary at the start."""
    leave_on = 1.0 / MEAN_ON_S
    enter_on = BURST_ON_SHARE * leave_on / (1.0 - BURST_ON_SHARE)
    states = np.empty((*shape, seconds), dtype=bool)
    state = rng.random(shape) < BURST_ON_SHARE
    draws = rng.random((*shape, seconds))
    for t in range(seconds):
        states[..., t] = state
        state = np.where(state, draws[..., t] >= leave_on, draws[..., t] < enter_on)
    return states


def _bursty(base: float, states: np.ndarray) -> np.ndarray:
    off = base * (1.0 - BURST_ON_SHARE * BURST_FACTOR) / (1.0 - BURST_ON_SHARE)
    return np.where(states, min(1.0, base * BURST_FACTOR), off)


def error_probs(
    cell: Cell, reg: Regression, trials: int, seconds: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Error probability per trial and second for canary and stable."""
    base_c = reg.canary_error(cell.base_error)
    if cell.model == "bursty":
        p_s = _bursty(cell.base_error, _chains(rng, (trials, STABLE_INSTANCES), seconds))
        p_s = p_s.mean(axis=1)
        p_c = _bursty(cell.base_error, _chains(rng, (trials,), seconds))
        p_c = np.minimum(1.0, p_c * reg.error_factor + reg.add_error)
    elif cell.model == "independent":
        p_s = np.full((trials, seconds), cell.base_error)
        p_c = np.full((trials, seconds), base_c)
    else:
        raise ValueError(f"unknown error model {cell.model!r}")
    if cell.outage:
        starts = rng.integers(30, 570, size=trials)
        t = np.arange(seconds)[None, :]
        hit = (t >= starts[:, None]) & (t < starts[:, None] + OUTAGE_S)
        p_s = np.where(hit, np.maximum(p_s, OUTAGE_ERROR), p_s)
        p_c = np.where(hit, np.maximum(p_c, OUTAGE_ERROR), p_c)
    return p_c, p_s


def simulate(
    cell: Cell, reg: Regression, trials: int, seconds: int, rng: np.random.Generator
) -> Blocks:
    """Draw every block of ``trials`` independent runs of ``seconds`` seconds."""
    shape = (trials, seconds)
    total = rng.poisson(cell.rps, shape)
    n_c = rng.binomial(total, cell.share)
    n_s = total - n_c
    p_c, p_s = error_probs(cell, reg, trials, seconds, rng)
    e_c = rng.binomial(n_c, p_c)
    e_s = rng.binomial(n_s, p_s)
    ok_c, ok_s = n_c - e_c, n_s - e_s
    slow_c = rng.binomial(ok_c, reg.canary_slow())
    slow_s = rng.binomial(ok_s, 1.0 - P99)
    return Blocks(n_c, n_s, e_c, e_s, ok_c, ok_s, slow_c, slow_s)
