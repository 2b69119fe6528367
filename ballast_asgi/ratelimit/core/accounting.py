"""Charge-back, recent-rate estimates and lease sizing: the bookkeeping of the shared modes.

**Charge-back.** While Redis is unreachable (breaker open, error, missed
deadline) a gateway decides on its own share of the limit. Each request it
admits that way is written into a ``ChargeBook`` (per key: how many, and when
the first one was). When Redis answers again the book is drained into the
shared bucket with ``gcra.charge``: as if the shared bucket had seen those
requests from the first one on. If that is already in the past the bucket has
refilled meanwhile ("expired") and nothing is charged. Without this, a gateway
that decides alone stops spending from the shared bucket and the others get
all of it (seed 002).

**Recent rate.** ``RateEstimate`` is an exponentially decaying event rate:
on each event ``r <- r * exp(-dt / tau) + 1 / tau`` (events per second), read
as ``r * exp(-(now - last) / tau)``. O(1) per request, no buckets. Until it
has seen a few ``tau`` of history the sum is biased low (it starts from 0), so
it is divided by ``1 - exp(-age / tau)`` (age at least ``MIN_AGE_S``): a new
key's first leases are sized to its real rate at once, not to a ramp. A gap
of ``5 tau`` without events starts a new history (the sum has decayed to
nothing, so the same correction applies when a key comes back). Below
``MIN_AGE_S`` of history the estimate still reads low (10 ms of a steady
750/s read about 150/s); ``known(now)`` says whether it has seen
``MATURE_S``, and ``sync`` mode publishes nothing for a key until it has.

**Demand share.** ``demand_share`` splits a limit between gateways by what
each was recently offered (``sync`` mode's local buckets; ``redis`` mode's
own share when it decides alone).

**Lease size.** A gateway leases what it expects to spend in one lease
window: ``clamp(ceil(rate * window_s), min_tokens, max_tokens)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class Charge:
    """Requests admitted alone for one key since ``since``."""

    count: int
    since: float
    #: The bucket's emission interval (seconds per token) when it was charged.
    interval_s: float


class ChargeBook:
    """Per-key counts of requests admitted without Redis, bounded in keys."""

    def __init__(self, max_keys: int = 10_000) -> None:
        self.max_keys = max_keys
        self._charges: dict[str, Charge] = {}
        self.recorded = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._charges)

    def add(self, key: str, now: float, interval_s: float, count: int = 1) -> None:
        """Remember ``count`` requests for ``key`` admitted alone at ``now``."""
        self.recorded += count
        entry = self._charges.get(key)
        if entry is not None:
            entry.count += count
            return
        if len(self._charges) >= self.max_keys:
            oldest = next(iter(self._charges))
            self.dropped += self._charges.pop(oldest).count
        self._charges[key] = Charge(count, now, interval_s)

    def cancel(self, key: str) -> bool:
        """Take back one pending charge for ``key`` (Redis counted it after all)."""
        entry = self._charges.get(key)
        if entry is None or entry.count <= 0:
            return False
        entry.count -= 1
        self.recorded -= 1
        if entry.count == 0:
            del self._charges[key]
        return True

    def drain(self, now: float, max_age_s: float) -> list[tuple[str, int, float, float]]:
        """Take every charge as ``(key, count, age_s, interval_s)``; older ones lapse."""
        out: list[tuple[str, int, float, float]] = []
        for key, entry in self._charges.items():
            age = now - entry.since
            if age <= max_age_s:
                out.append((key, entry.count, age, entry.interval_s))
            else:
                self.dropped += entry.count
        self._charges.clear()
        return out

    def restore(self, items: list[tuple[str, int, float, float]], now: float) -> None:
        """Put back charges whose flush failed (Redis went away again)."""
        for key, count, age, interval_s in items:
            self.recorded -= count
            self.add(key, now - age, interval_s, count)


#: Youngest history the start-up correction trusts (one event reads as ~1 / (tau * 0.1)).
MIN_AGE_S = 0.05
#: History an estimate needs before a peer may divide a limit by it (within ~10 % noise at
#: hundreds of events a second, no bias: ``known``).
MATURE_S = 0.1


class RateEstimate:
    """Exponentially decaying rate of events (per second) with time constant ``tau_s``."""

    __slots__ = ("_first", "_last", "_rate", "tau_s")

    def __init__(self, tau_s: float = 0.5) -> None:
        if tau_s <= 0:
            raise ValueError(f"tau_s must be > 0, got {tau_s}")
        self.tau_s = tau_s
        self._rate = 0.0
        self._last = float("-inf")
        self._first: float | None = None

    def add(self, now: float, count: float = 1.0) -> None:
        """Count ``count`` events at ``now``."""
        if self._first is None or now - self._last > 5 * self.tau_s:
            self._first = now
        self._rate = self._raw(now) + count / self.tau_s
        self._last = now

    def _raw(self, now: float) -> float:
        if self._rate == 0.0:
            return 0.0
        return self._rate * math.exp(-max(0.0, now - self._last) / self.tau_s)

    def known(self, now: float) -> bool:
        """Has the current history lasted ``MATURE_S`` (younger estimates read low)?"""
        return self._first is not None and now - self._first >= MATURE_S

    def rate(self, now: float) -> float:
        """The estimate at ``now`` (events per second), corrected while history is short."""
        raw = self._raw(now)
        if raw == 0.0 or self._first is None:
            return raw
        age = max(MIN_AGE_S, now - self._first)
        if age >= 5 * self.tau_s:
            return raw
        return raw / (1.0 - math.exp(-age / self.tau_s))


def lease_size(rate_per_s: float, window_s: float, min_tokens: int, max_tokens: int) -> int:
    """Tokens to lease: what ``rate_per_s`` spends in ``window_s``, within the bounds."""
    want = math.ceil(rate_per_s * window_s)
    return max(min_tokens, min(max_tokens, want))


def demand_share(
    mine: float, total: float, live: int, rate: float, published: int | None = None
) -> float:
    """This gateway's fraction of ``rate``: its demand plus an even part of the headroom.

    With total demand ``total`` below ``rate`` each gateway gets its own demand plus an
    even part of the headroom ``(rate - total) / live`` (room for a spike at once); above
    it, ``mine / total``. The shares add up to the limit in both cases. ``published``
    gateways reported demand for the key; the other ``live - published`` (just started,
    or new to the key) are assumed to offer the average of those, so one gateway never
    takes the whole limit because its peers have not spoken yet.
    """
    live = max(1, live)
    if total <= 0:
        return 1.0 / live
    if published is not None and 0 < published < live:
        total = total * live / published
    if total < rate:
        return min(1.0, (mine + (rate - total) / live) / rate)
    return max(1e-3, mine / total)
