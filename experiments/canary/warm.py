"""The warm start in the simulation: the stable instances' history before the canary began.

A real gateway has served the stable version for a long time when a canary
starts, and the pool knows which instance served each request. Each trial
therefore gets ``HISTORY_S`` (10 minutes) of stable-only traffic before its
first block: every stable instance serves ``rps / 4`` (Poisson per second)
under the cell's own error model and parameters (the bursty model's ON/OFF
chain per instance, the same as in the run; slow requests independent at 1 %),
and no outage (the outage is in the run). The history is drawn from its own
seed (the cell's, plus ``"history"``), so the run's blocks are the very ones
the rules saw before the warm start existed.

From it the judge's regime per trial and metric is decided exactly as the
gateway does (``ballast_asgi/canary/core/history.py``, vectorised here; a test
checks both agree): calm (no burst cap) or bursty/undecided (the burst cap).
The chain of the history is started stationary and independent of the run's
(a 2 s mean spell forgets its state within seconds; the run's instances are
started stationary too).
"""

from __future__ import annotations

import numpy as np

from ballast_asgi.canary.core.history import HistoryParams
from experiments.canary.model import P99, STABLE_INSTANCES, Cell, _bursty, _chains

HISTORY_S = 600
DEFAULT_HISTORY = HistoryParams()


def history(
    cell: Cell, trials: int, rng: np.random.Generator, seconds: int = HISTORY_S
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per trial, instance and second: requests, errors, timed successes, slow ones."""
    shape = (trials, STABLE_INSTANCES, seconds)
    n = rng.poisson(cell.rps / STABLE_INSTANCES, shape)
    if cell.model == "bursty":
        p = _bursty(cell.base_error, _chains(rng, (trials, STABLE_INSTANCES), seconds))
    else:
        p = np.full(shape, cell.base_error)
    e = rng.binomial(n, p)
    ok = n - e
    slow = rng.binomial(ok, 1.0 - P99)
    return n, e, ok, slow


def dispersion_z(n: np.ndarray, e: np.ndarray, window: int) -> np.ndarray:
    """``history.dispersion_z`` per trial over (instance, window) cells (nan: no events)."""
    trials, instances, seconds = n.shape
    cut = seconds // window * window
    big_n = n[..., :cut].reshape(trials, instances, -1, window).sum(-1).reshape(trials, -1)
    big_e = e[..., :cut].reshape(trials, instances, -1, window).sum(-1).reshape(trials, -1)
    big_n, big_e = big_n.astype(np.float64), big_e.astype(np.float64)
    tot_n, tot_e = big_n.sum(1, keepdims=True), big_e.sum(1, keepdims=True)
    p = np.divide(tot_e, tot_n, out=np.zeros_like(tot_e), where=tot_n > 0)
    v = big_n * p * (1.0 - p)
    ok = v > 0
    safe = np.where(ok, v, 1.0)
    num = np.where(ok, (big_e - big_n * p) ** 2 / safe - 1.0, 0.0).sum(1)
    var = np.where(ok, 2.0 + 1.0 / safe, 0.0).sum(1)
    defined = (tot_e[:, 0] > 0) & (tot_e[:, 0] < tot_n[:, 0])
    z: np.ndarray = np.where(defined, num / np.sqrt(np.where(var > 0, var, 1.0)), np.nan)
    return z


def calm(n: np.ndarray, e: np.ndarray, params: HistoryParams = DEFAULT_HISTORY) -> np.ndarray:
    """Per trial: whether the judge decides ``calm`` (no burst cap) from this history."""
    window = round(params.window_s)
    z = dispersion_z(n, e, window)
    enough = e.sum(axis=(1, 2)) >= params.min_events
    out: np.ndarray = enough & np.isfinite(z) & (z < params.burst_z)
    return out


def regimes(
    cell: Cell, trials: int, rng: np.random.Generator, params: HistoryParams = DEFAULT_HISTORY
) -> tuple[np.ndarray, np.ndarray]:
    """Per trial: calm on errors, calm on latency (from a fresh history)."""
    n, e, ok, slow = history(cell, trials, rng, round(params.history_s))
    return calm(n, e, params), calm(ok, slow, params)


__all__ = ["HISTORY_S", "calm", "dispersion_z", "history", "regimes"]
