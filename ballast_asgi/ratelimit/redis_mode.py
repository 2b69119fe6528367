"""``redis`` mode: one atomic GCRA script per request (``EVALSHA``), exact across gateways.

The request waits at most ``redis_timeout_ms`` (default 2 ms) for the answer.
On a miss, an error or an open breaker it is decided on this gateway's share
(``SharedBase.degrade``) and, if admitted, charged back later. A late answer
is reconciled: if Redis admitted it too, the shared bucket already counted it
(the pending charge is cancelled); if Redis refused it, the charge stands; if
Redis admitted a request this gateway refused, the token goes back. What Redis
admits on time is also taken from this gateway's own share
(``SharedBase.count_admitted``), so what it decides alone and what Redis
admitted for it together stay within its share.

**The own share follows demand.** Every ``demand_s`` per key, one of the
key's calls also publishes this gateway's recent request rate for it
(``GCRA_DEMAND``) and reads the total over the gateways that published within
``stale_s``. The share is then ``accounting.demand_share`` (the rule ``sync``
mode uses): under a 90/10 split the busy gateway decides alone on 90 % of the
limit, not half of it. A static half refused good requests whenever the busy
gateway's event loop was late (-27.7 % admitted against a perfect bucket in the
shifting run). Until a key has been published, or once its last answer is
older than ``stale_s`` (Redis gone), the share is ``1 / live gateways``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ballast_asgi.ratelimit.core.accounting import RateEstimate, demand_share
from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.core.table import KeyTable
from ballast_asgi.ratelimit.shared import Missed, SharedBase


@dataclass(slots=True, eq=False)
class KeyDemand:
    """One key's recent demand on this gateway and the share it was last given."""

    demand: RateEstimate = field(default_factory=lambda: RateEstimate(0.5))
    #: When this gateway last sent its demand for the key.
    sent_at: float = -math.inf
    #: When Redis last answered with the total (the share is trusted for ``stale_s``).
    share_at: float = -math.inf
    share: float = 0.0
    #: The rate this gateway sent last (its share is computed from this same number).
    published: float = 0.0


def _no_debt(state: KeyDemand, now: float) -> bool:
    return False


class RedisLimiter(SharedBase):
    """The ``redis`` mode driver."""

    mode = "redis"

    def __init__(self, *args: Any, demand_s: float = 0.2, max_keys: int = 10_000, **kwargs: Any):
        super().__init__(*args, max_keys=max_keys, **kwargs)
        self.demand_s = demand_s
        self.stale_s = max(0.5, 5 * demand_s)
        self.demands: KeyTable[KeyDemand] = KeyTable(max_keys, _no_debt)

    def share(self, key: str, now: float) -> float:
        """The key's demand share while fresh, else ``1 / live``."""
        state = self.demands.peek(key)
        if state is None or now - state.share_at > self.stale_s:
            return 1.0 / max(1, self.live)
        return state.share

    async def decide(self, key: str, limits: Limits) -> Decision:
        """Ask Redis; fall back to the local share within the deadline."""
        self.ensure_started()
        now = self.clock()
        state = self.demands.get(key)
        if state is None:
            state = KeyDemand()
            self.demands.put(key, state, now)
        state.demand.add(now)
        op, keys, args = self._request(key, state, limits, now)
        decided: list[Decision] = []

        def late(result: Any) -> None:
            if result is None:
                return
            self._learn(state, result, limits, self.clock())
            if not int(result[0]) or not decided:
                return
            if decided[0].allowed:
                self.charges.cancel(key)  # Redis counted it itself
            else:  # Redis spent a token on a request this gateway refused: return it
                self.spawn(self._give_back_one(key, limits))

        try:
            result = await self.call(op, keys, args, on_late=late)
        except Missed:
            # Decided now, not when the request arrived: on a busy loop the wait ends late and
            # out of order, and a bucket fed times that go backwards refuses what it should admit.
            decision = self.degrade(key, limits, self.clock())
            decided.append(decision)
            return decision
        now = self.clock()
        self._learn(state, result, limits, now)
        decision = from_debt(bool(int(result[0])), float(result[1]), limits)
        if decision.allowed:
            self.count_admitted(key, limits, now)
        self.stats.decided(decision.allowed, "redis")
        return decision

    def _request(
        self, key: str, state: KeyDemand, limits: Limits, now: float
    ) -> tuple[str, list[str], list[Any]]:
        """The plain GCRA call, or (every ``demand_s`` per key) the one that publishes demand."""
        args: list[Any] = [repr(limits.interval_s), repr(limits.tau_s), 1]
        bucket = self.key("b", key)
        if now - state.sent_at < self.demand_s:
            return "gcra", [bucket], args
        state.sent_at = now
        state.published = round(state.demand.rate(now), 3)
        rate = f"{state.published:.3f}"
        return "gcra_demand", [bucket, self.key("d", key)], [*args, self.id, rate, self.stale_s]

    def _learn(self, state: KeyDemand, result: Any, limits: Limits, now: float) -> None:
        """A ``GCRA_DEMAND`` answer: this gateway's share of the key's limit."""
        if len(result) < 4:
            return
        total, published = float(result[2]), int(result[3])
        live = max(published, self.live)
        state.share = demand_share(state.published, total, live, limits.rate_per_s, published)
        state.share_at = now

    async def _give_back_one(self, key: str, limits: Limits) -> None:
        args = (repr(limits.interval_s), repr(limits.tau_s), 1)
        try:
            await self.bookkeeping("give_back", [self.key("b", key)], args)
        except Missed:
            return

    def snapshot(self) -> dict[str, Any]:
        """The shared snapshot plus the demand table."""
        doc = super().snapshot()
        doc["demand_keys"] = self.demands.snapshot()
        return doc


def from_debt(allowed: bool, debt_s: float, limits: Limits) -> Decision:
    """A ``Decision`` from the script's reply (``debt_s`` = tat - now after the decision)."""
    left = (limits.tau_s - debt_s) * limits.rate_per_s
    remaining = max(0, int(left + 1e-9))
    retry = 0.0 if remaining >= 1 else max(0.0, debt_s + limits.interval_s - limits.tau_s)
    return Decision(allowed, remaining, retry, max(0.0, debt_s), limits)
