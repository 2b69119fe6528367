"""``redis`` mode: one atomic GCRA script per request (``EVALSHA``), exact across gateways.

The request waits at most ``redis_timeout_ms`` (default 2 ms) for the answer.
On a miss, an error or an open breaker it is decided on this gateway's share
(``SharedBase.degrade``) and, if admitted, charged back later. A late answer
is reconciled: if Redis admitted it too, the shared bucket already counted it
(the pending charge is cancelled); if Redis refused it, the charge stands; if
Redis admitted a request this gateway refused, the token goes back.

Deciding alone, the gateway follows Redis's recent verdicts on its own traffic
(``core/verdicts.py``: every call runs in Redis, on time or late, and the
admit ratio of those answers is this gateway's fair part, however the traffic
is split); only when no verdict came within a second (Redis gone) does it use
the static share ``limit / live gateways``.
"""

from __future__ import annotations

from typing import Any

from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.core.table import KeyTable
from ballast_asgi.ratelimit.core.verdicts import AdmitRatio
from ballast_asgi.ratelimit.shared import Missed, SharedBase


def _recent(ratio: AdmitRatio, now: float) -> bool:
    return ratio.fresh(now)


class RedisLimiter(SharedBase):
    """The ``redis`` mode driver."""

    mode = "redis"

    def __init__(self, *args: Any, max_keys: int = 10_000, **kwargs: Any) -> None:
        super().__init__(*args, max_keys=max_keys, **kwargs)
        self.verdicts: KeyTable[AdmitRatio] = KeyTable(max_keys, _recent)

    def _verdict(self, key: str, allowed: bool) -> None:
        now = self.clock()
        ratio = self.verdicts.get(key)
        if ratio is None:
            ratio = AdmitRatio()
            self.verdicts.put(key, ratio, now)
        ratio.record(allowed, now)

    def degrade(self, key: str, limits: Limits, now: float) -> Decision:
        """Decide alone: at Redis's recent admit ratio for this key, else on the static share."""
        ratio = self.verdicts.peek(key)
        if ratio is None or not ratio.fresh(now):
            return super().degrade(key, limits, now)
        allowed = ratio.take()
        if allowed and self.charge_back:
            self.charges.add(key, now, limits.interval_s)
        self.stats.decided(allowed, "degraded")
        retry = 0.0 if allowed else limits.interval_s
        return Decision(allowed, 0, retry, limits.tau_s, limits, degraded=True)

    async def decide(self, key: str, limits: Limits) -> Decision:
        """Ask Redis; fall back to the local share within the deadline."""
        self.ensure_started()
        now = self.clock()
        args = (repr(limits.interval_s), repr(limits.tau_s), 1)
        decided: list[Decision] = []

        def late(result: Any) -> None:
            if result is not None:
                self._verdict(key, bool(int(result[0])))
            if result is None or not int(result[0]) or not decided:
                return
            if decided[0].allowed:
                self.charges.cancel(key)  # Redis counted it itself
            else:  # Redis spent a token on a request this gateway refused: return it
                self.spawn(self._give_back_one(key, limits))

        try:
            allowed, debt = await self.call("gcra", [self.key("b", key)], args, on_late=late)
        except Missed:
            decision = self.degrade(key, limits, now)
            decided.append(decision)
            return decision
        decision = from_debt(bool(int(allowed)), float(debt), limits)
        self._verdict(key, decision.allowed)
        self.stats.decided(decision.allowed, "redis")
        return decision

    async def _give_back_one(self, key: str, limits: Limits) -> None:
        args = (repr(limits.interval_s), repr(limits.tau_s), 1)
        try:
            await self.background("give_back", [self.key("b", key)], args)
        except Missed:
            return


def from_debt(allowed: bool, debt_s: float, limits: Limits) -> Decision:
    """A ``Decision`` from the script's reply (``debt_s`` = tat - now after the decision)."""
    left = (limits.tau_s - debt_s) * limits.rate_per_s
    remaining = max(0, int(left + 1e-9))
    retry = 0.0 if remaining >= 1 else max(0.0, debt_s + limits.interval_s - limits.tau_s)
    return Decision(allowed, remaining, retry, max(0.0, debt_s), limits)
