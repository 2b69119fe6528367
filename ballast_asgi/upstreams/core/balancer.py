"""Choosing one instance among the eligible ones (pure).

Two policies, each a pure function of the candidates' numbers and an injected
``random.Random``:

**Power of two choices** (``p2c``, the default). Draw two distinct candidates,
each with probability proportional to its weight, and keep the one with the
lower cost (the first drawn on a tie)::

    cost(i) = outstanding(i) + 1                       # "least outstanding"
    cost(i) = peak_ewma_rtt(i) * (outstanding(i) + 1)  # scoring="peak_ewma"

Weights act through the draws: when instances are idle (costs tie) each one
gets its weight's share; under load the shorter queue wins, so a slow
instance's share falls whatever its weight.

Two random draws avoid the herd that "pick the global minimum" causes when
many requests see the same stale numbers, and still send almost nothing to an
instance that is slow (its outstanding count grows). Reference: Mitzenmacher,
"The Power of Two Choices in Randomized Load Balancing" (2001); Finagle's
``P2CLeastLoaded`` and ``P2CPeakEwma``; Envoy's ``LEAST_REQUEST``.

**Smooth weighted round robin** (``round_robin``), nginx's algorithm: every
pick adds each candidate's weight to its running score, takes the highest and
subtracts the total weight from it. Over ``sum(weights)`` picks each instance
is chosen exactly ``weight`` times, interleaved (5,1,1 gives a a b a c a a).

**Peak EWMA.** ``PeakEwma`` keeps an RTT estimate that jumps up to any sample
above it at once and decays towards lower ones with time constant ``tau_s``
(default 1 s): ``est = est * w + rtt * (1 - w)`` with ``w = exp(-dt / tau)``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class Candidate(Protocol):
    """What a balancer reads from an instance."""

    @property
    def weight(self) -> float: ...

    @property
    def outstanding(self) -> int: ...

    @property
    def rtt_ewma_s(self) -> float: ...


C = TypeVar("C", bound=Candidate)


def least_outstanding(c: Candidate) -> float:
    """Cost of a candidate by its requests in flight."""
    return float(c.outstanding + 1)


def peak_ewma(c: Candidate) -> float:
    """Cost by expected latency: peak-EWMA RTT times the queue it would join."""
    return max(c.rtt_ewma_s, 1e-6) * (c.outstanding + 1)


SCORES: dict[str, Callable[[Candidate], float]] = {
    "least_outstanding": least_outstanding,
    "peak_ewma": peak_ewma,
}


def weighted_index(weights: Sequence[float], rng: random.Random) -> int:
    """An index drawn with probability proportional to its weight."""
    total = math.fsum(weights)
    x = rng.random() * total
    for i, w in enumerate(weights):
        x -= w
        if x < 0.0:
            return i
    return len(weights) - 1


def p2c(
    candidates: Sequence[C],
    rng: random.Random,
    cost: Callable[[Candidate], float] = least_outstanding,
) -> C:
    """Power of two choices: the cheaper of two distinct weighted draws."""
    if not candidates:
        raise ValueError("p2c needs at least one candidate")
    if len(candidates) == 1:
        return candidates[0]
    weights = [c.weight for c in candidates]
    a = weighted_index(weights, rng)
    weights[a] = 0.0
    b = weighted_index(weights, rng) if math.fsum(weights) > 0 else a
    ca, cb = candidates[a], candidates[b]
    return cb if cost(cb) < cost(ca) else ca


class SmoothRoundRobin:
    """nginx's smooth weighted round robin over instances named by a key."""

    def __init__(self) -> None:
        self._current: dict[str, float] = {}

    def pick(self, candidates: Sequence[C], key: Callable[[C], str]) -> C:
        """The next candidate in weighted order (state kept per key)."""
        if not candidates:
            raise ValueError("round robin needs at least one candidate")
        total = 0.0
        best: C | None = None
        best_score = -math.inf
        for c in candidates:
            k = key(c)
            score = self._current.get(k, 0.0) + c.weight
            self._current[k] = score
            total += c.weight
            if score > best_score:
                best, best_score = c, score
        assert best is not None
        self._current[key(best)] -= total
        return best

    def forget(self, keep: set[str]) -> None:
        """Drop the state of instances that are gone."""
        for k in list(self._current):
            if k not in keep:
                del self._current[k]


class PeakEwma:
    """An RTT estimate that rises at once to a peak and decays with time."""

    __slots__ = ("_at", "tau_s", "value_s")

    def __init__(self, tau_s: float = 1.0) -> None:
        if not tau_s > 0:
            raise ValueError(f"tau_s must be > 0, got {tau_s}")
        self.tau_s = tau_s
        self.value_s = 0.0
        self._at: float | None = None

    def observe(self, rtt_s: float, now: float) -> float:
        """Take one RTT sample at ``now``; return the estimate."""
        if self._at is None or rtt_s > self.value_s:
            self.value_s = rtt_s
        else:
            w = math.exp(-max(0.0, now - self._at) / self.tau_s)
            self.value_s = self.value_s * w + rtt_s * (1.0 - w)
        self._at = now
        return self.value_s
