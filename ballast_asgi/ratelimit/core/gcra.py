"""GCRA, the generic cell rate algorithm: a token bucket kept as one number.

A bucket that refills at ``rate_per_s`` tokens per second up to ``burst``
tokens is stored as its *theoretical arrival time* ``tat`` (monotonic seconds):
the time at which it would be full again. With the emission interval
``T = 1 / rate_per_s`` and the tolerance ``tau = burst * T``:

    tokens(now)  = (tau - max(tat - now, 0)) / T
    new_tat      = max(tat, now) + cost * T
    allowed      iff new_tat - now <= tau          (the bucket held >= cost tokens)
    retry_after  = new_tat - tau - now             (when denied: until cost tokens exist)

A fresh or long-idle key (``tat <= now``) holds ``burst`` tokens. This is the
same algorithm the Redis script runs (``client.GCRA_LUA``), so a shared bucket
and a local one agree to the last token. Reference: ATM Forum TM 4.0 (GCRA);
Brandur Leach, "Rate limiting, cells and GCRA".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Float slack so that n requests spaced exactly T apart are all admitted.
EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Limits:
    """One bucket's shape: sustained rate and burst, plus the policy name it reports."""

    rate_per_s: float
    burst: int
    name: str = "default"

    def __post_init__(self) -> None:
        if not self.rate_per_s > 0:
            raise ValueError(f"rate_per_s must be > 0, got {self.rate_per_s}")
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {self.burst}")

    @property
    def interval_s(self) -> float:
        """Emission interval T: seconds per token."""
        return 1.0 / self.rate_per_s

    @property
    def tau_s(self) -> float:
        """Tolerance: seconds of refill the bucket can hold."""
        return self.burst / self.rate_per_s

    def scaled(self, share: float) -> Limits:
        """This bucket's ``share`` (0..1] for one of several gateways (burst >= 1)."""
        share = min(1.0, max(share, 1e-6))
        burst = max(1, math.floor(self.burst * share))
        return Limits(self.rate_per_s * share, burst, self.name)


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer for one request."""

    allowed: bool
    #: Whole tokens left after this decision.
    remaining: int
    #: Seconds until the next request would be admitted (0 when tokens are left).
    retry_after_s: float
    #: Seconds until the bucket is full again.
    reset_s: float
    limits: Limits
    #: True when this gateway decided on its own share because Redis did not answer.
    degraded: bool = False


def tokens(tat: float, now: float, limits: Limits) -> float:
    """Tokens the bucket holds at ``now``."""
    return (limits.tau_s - max(tat - now, 0.0)) * limits.rate_per_s


def decide(tat: float, now: float, limits: Limits, cost: int = 1) -> tuple[Decision, float]:
    """Admit or deny ``cost`` tokens; return the decision and the bucket's new ``tat``."""
    base = tat if tat > now else now
    new_tat = base + cost * limits.interval_s
    tau = limits.tau_s
    if new_tat - now <= tau + EPS:
        return _answer(True, new_tat, now, limits), new_tat
    return _answer(False, tat, now, limits, new_tat - tau - now), tat


def _answer(
    allowed: bool, tat: float, now: float, limits: Limits, retry_after_s: float = 0.0
) -> Decision:
    left = tokens(tat, now, limits)
    remaining = max(0, math.floor(left + EPS))
    if allowed and remaining < 1:
        retry_after_s = max(0.0, tat - limits.tau_s + limits.interval_s - now)
    return Decision(allowed, remaining, max(0.0, retry_after_s), max(0.0, tat - now), limits)


def take_up_to(tat: float, now: float, limits: Limits, want: int) -> tuple[int, float]:
    """Take at most ``want`` whole tokens at once (a lease); return (granted, new tat)."""
    have = math.floor(tokens(tat, now, limits) + EPS)
    granted = max(0, min(want, have))
    if granted == 0:
        return 0, tat
    return granted, max(tat, now) + granted * limits.interval_s


def give_back(tat: float, now: float, limits: Limits, count: int) -> float:
    """Return ``count`` unspent tokens to the bucket (never below a full bucket)."""
    return max(now, tat - count * limits.interval_s)


def charge(tat: float, now: float, limits: Limits, count: int, since: float) -> float:
    """Charge ``count`` tokens spent from ``since`` on, without refusing anything.

    Used for charge-back: requests a gateway admitted alone are added as if the
    shared bucket had seen them at ``since``. When the result is already in the
    past the bucket would have refilled by now (it expired): nothing changes.
    """
    charged = max(tat, since) + count * limits.interval_s
    return charged if charged > tat else tat


class ReferenceBucket:
    """A plain floating-point token bucket: the oracle GCRA is tested against.

    It is also the *perfect single bucket* the experiment replays over the
    requests both gateways saw, to count over- and under-admission.
    """

    def __init__(self, limits: Limits, now: float = 0.0) -> None:
        self.limits = limits
        self.level = float(limits.burst)
        self.last = now

    def take(self, now: float, cost: int = 1) -> bool:
        """Refill to ``now`` and take ``cost`` tokens if the bucket holds them."""
        elapsed = max(0.0, now - self.last)
        self.last = max(self.last, now)
        self.level = min(float(self.limits.burst), self.level + elapsed * self.limits.rate_per_s)
        if self.level + EPS >= cost:
            self.level -= cost
            return True
        return False
