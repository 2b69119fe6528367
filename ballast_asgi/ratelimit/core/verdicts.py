"""Redis's recent verdicts for one key, as a share a gateway can follow when it decides alone.

In ``redis`` mode every request's script runs in Redis, even when its answer
comes back too late for the request (the gateway then decided alone). Those
answers are Redis's verdicts on this gateway's own traffic: their recent admit
ratio is the fraction of this gateway's requests the shared bucket admits
now, whatever the split between gateways. ``AdmitRatio`` keeps that ratio (an
exponentially weighted mean over verdicts, ``alpha`` per verdict) and admits
requests decided alone at the same ratio, deterministically (a credit that
grows by the ratio per request and pays 1 per admission, at most one saved
up). A gateway with 90 % of the traffic then admits 90 % of what is admitted,
which a static ``limit / live`` share cannot do; and if it admits one that
Redis refuses, the charge-back pushes the bucket into debt, Redis refuses
more, and the ratio comes down. Verdicts older than ``fresh_s`` are not
followed (Redis is gone; the driver falls back to the static share).
"""

from __future__ import annotations

import math

#: Weight of each new verdict (about the last 20 count).
DEFAULT_ALPHA = 0.05
#: Verdicts older than this are not followed.
DEFAULT_FRESH_S = 1.0


class AdmitRatio:
    """Recent admit ratio of one key's verdicts and a deterministic admission at that ratio."""

    __slots__ = ("alpha", "credit", "fresh_s", "last", "ratio")

    def __init__(self, alpha: float = DEFAULT_ALPHA, fresh_s: float = DEFAULT_FRESH_S) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = alpha
        self.fresh_s = fresh_s
        self.ratio = 1.0
        self.last = -math.inf
        self.credit = 0.0

    def record(self, allowed: bool, now: float) -> None:
        """One verdict from Redis at ``now``."""
        if self.last == -math.inf:
            self.ratio = 1.0 if allowed else 0.0
        else:
            self.ratio += self.alpha * ((1.0 if allowed else 0.0) - self.ratio)
        self.last = now

    def fresh(self, now: float) -> bool:
        """Was there a verdict within ``fresh_s``?"""
        return now - self.last <= self.fresh_s

    def take(self) -> bool:
        """Admit one request decided alone at the recent ratio (deterministic)."""
        self.credit += self.ratio
        admit = self.credit >= 1.0 - 1e-9
        if admit:
            self.credit -= 1.0
        self.credit = min(self.credit, 1.0)  # at most one admission saved up
        return admit
