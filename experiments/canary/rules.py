"""The three rules over simulated blocks, vectorised over trials (numpy).

Each function returns, per trial, the second at which the rule rolled the
canary back (``inf`` when it never did within the run). They implement the
same arithmetic as the pure judges in ``ballast_asgi/canary/core/judges.py``;
``tests/experiments/test_canary_sim.py`` checks that both give the same rollback times on
the same blocks.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

from ballast_asgi.canary.core.evidence import DEFAULT_PARAMS, EvidenceParams
from ballast_asgi.canary.core.judges import CALM_CAP_NATS, ERROR_SHARE
from experiments.canary.model import Blocks


def _share(part: np.ndarray, other: np.ndarray) -> np.ndarray:
    total = part + other
    out: np.ndarray = np.divide(part, total, out=np.zeros(part.shape), where=total > 0)
    return out


class _Mixture:
    """One metric's capped mixture over all trials, stepped block by block."""

    def __init__(
        self,
        events_c: np.ndarray,
        events_s: np.ndarray,
        share: np.ndarray,
        log_bound: float,
        params: EvidenceParams,
        caps: np.ndarray | None = None,
        scale: np.ndarray | None = None,
    ) -> None:
        ratios = np.asarray(params.ratios())
        self.ratios, self.log_r = ratios, np.log(ratios)
        self.log_w = np.asarray(params.log_weights())
        self.cap, self.gap, self.log_bound = params.cap_nats, params.single_event_gap_s, log_bound
        self.events_c, self.share, self.caps, self.scale = events_c, share, caps, scale
        self.events = events_c + events_s
        self.live = (self.events > 0) & (share > 0.0) & (share < 1.0)
        trials = events_c.shape[0]
        self.sums = np.zeros((trials, len(ratios)))
        self.last = np.full((trials, len(ratios)), -np.inf)
        self.out = np.full(trials, np.inf)

    def step(self, t: int) -> None:
        """Add block ``t``; trials whose e-value first reaches the bound cross at ``t + 1``."""
        on = self.live[:, t]
        if not on.any():
            return
        drag = self.events[on, t, None] * np.log1p(self.share[on, t, None] * (self.ratios - 1.0))
        single = np.where(t - self.last[on] >= self.gap, self.log_r - drag, -np.inf)
        c = self.cap if self.caps is None else self.caps[on, t, None]
        add = np.minimum(self.events_c[on, t, None] * self.log_r - drag, np.maximum(c, single))
        self.last[on] = np.where(add > c, float(t), self.last[on])
        self.sums[on] += add if self.scale is None else add / self.scale[on, t, None]
        sums = self.sums[on]  # only these changed
        top = sums.max(axis=1)
        log_e = top + np.log(np.exp(sums - top[:, None] + self.log_w).sum(axis=1))
        out = self.out[on]
        self.out[on] = np.where((log_e >= self.log_bound) & np.isinf(out), t + 1.0, out)


def _first(metrics: list[_Mixture]) -> np.ndarray:
    """Per trial, the first second at which any metric crossed (stops once every trial has)."""
    seconds = metrics[0].events_c.shape[1]
    first = np.full(metrics[0].out.shape, np.inf)
    for t in range(seconds):
        for m in metrics:
            m.step(t)
        first = np.min([m.out for m in metrics], axis=0)
        if np.isfinite(first).all():
            break
    return first


def _crossing(
    events_c: np.ndarray,
    events_s: np.ndarray,
    share: np.ndarray,
    log_bound: float,
    params: EvidenceParams,
    caps: np.ndarray | None = None,
    scale: np.ndarray | None = None,
) -> np.ndarray:
    """Seconds (block index + 1) at which the capped mixture first reaches the bound.

    One step per block over all trials and grid points at once (the one-event
    allowance depends on the past, so blocks are taken in order); stops early
    once every trial has crossed. ``caps`` (per trial and block) replaces
    ``params.cap_nats`` and each block's gain is divided by ``scale``: the
    variants ``empirical_null.py`` explores (the judge uses neither).
    """
    return _first([_Mixture(events_c, events_s, share, log_bound, params, caps, scale)])


def _caps(calm: np.ndarray | None, shape: tuple[int, ...], params: EvidenceParams,
          calm_cap: float) -> np.ndarray | None:  # fmt: skip
    """Per trial and block: the calm cap where the stable history showed no bursts."""
    if calm is None:
        return None
    per_trial = np.where(calm, max(calm_cap, params.cap_nats), params.cap_nats)
    return np.broadcast_to(per_trial[:, None], shape)


def sequential(
    b: Blocks,
    alpha: float,
    error_share: float = ERROR_SHARE,
    params: EvidenceParams = DEFAULT_PARAMS,
    calm: tuple[np.ndarray, np.ndarray] | None = None,
    calm_cap: float = CALM_CAP_NATS,
) -> np.ndarray:
    """Our rule: errors at ``alpha * error_share``, slow requests at the rest; first to cross.

    ``calm``: per trial, whether the stable history (``warm.py``) showed no bursts
    on errors and on latency; those trials' metric runs at ``calm_cap`` from the
    first block (None: the cap everywhere, as without a warm start).
    """
    shape = b.errors_c.shape
    cal_e, cal_l = (None, None) if calm is None else calm
    err = _Mixture(
        b.errors_c, b.errors_s, _share(b.requests_c, b.requests_s),
        -math.log(alpha * error_share), params, _caps(cal_e, shape, params, calm_cap),
    )  # fmt: skip
    lat = _Mixture(
        b.slow_c, b.slow_s, _share(b.timed_c, b.timed_s),
        -math.log(alpha * (1.0 - error_share)), params, _caps(cal_l, shape, params, calm_cap),
    )  # fmt: skip
    return _first([err, lat])  # both metrics in one pass: stops once every trial rolled back


def fixed_horizon(b: Blocks, alpha: float, horizon_s: int = 600) -> np.ndarray:
    """One-sided pooled two-proportion z-test on errors after ``horizon_s`` seconds."""
    h = slice(0, horizon_s)
    n_c, n_s = b.requests_c[:, h].sum(1), b.requests_s[:, h].sum(1)
    e_c, e_s = b.errors_c[:, h].sum(1), b.errors_s[:, h].sum(1)
    pooled = (e_c + e_s) / np.maximum(n_c + n_s, 1)
    var = pooled * (1 - pooled) * (1 / np.maximum(n_c, 1) + 1 / np.maximum(n_s, 1))
    diff = e_c / np.maximum(n_c, 1) - e_s / np.maximum(n_s, 1)
    z = np.divide(diff, np.sqrt(var), out=np.zeros(diff.shape), where=var > 0)
    z = np.where((n_c > 0) & (n_s > 0), z, 0.0)
    reject = z >= NormalDist().inv_cdf(1 - alpha)
    return np.where(reject & (b.requests_c.shape[1] >= horizon_s), float(horizon_s), np.inf)


def threshold(
    b: Blocks, window_s: int = 60, min_success: float = 0.99, max_failed: int = 5
) -> np.ndarray:
    """Flagger-like: failed 60 s checks of the canary's success rate; 5 roll back."""
    trials, seconds = b.requests_c.shape
    windows = seconds // window_s
    shape = (trials, windows, window_s)
    n = b.requests_c[:, : windows * window_s].reshape(shape).sum(2)
    e = b.errors_c[:, : windows * window_s].reshape(shape).sum(2)
    success = 1.0 - e / np.maximum(n, 1)
    failed = (n > 0) & (success < min_success)
    hit = np.cumsum(failed, axis=1) >= max_failed
    first = (hit.argmax(axis=1) + 1.0) * window_s
    return np.where(hit.any(axis=1), first, np.inf)


def apply(
    rule: str, b: Blocks, alpha: float, calm: tuple[np.ndarray, np.ndarray] | None = None
) -> np.ndarray:
    """Rollback times of every trial under ``rule`` (the baselines at their defaults).

    ``calm``: the sequential rule's warm start (per trial, from ``warm.regimes``);
    ``sequential_cold`` is the same rule without it (the cap everywhere).
    """
    if rule == "sequential":
        return sequential(b, alpha, calm=calm)
    if rule == "sequential_cold":
        return sequential(b, alpha)
    if rule == "fixed_horizon":
        return fixed_horizon(b, alpha)
    return threshold(b)
