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
"""

from __future__ import annotations

from typing import Any

from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.shared import Missed, SharedBase


class RedisLimiter(SharedBase):
    """The ``redis`` mode driver."""

    mode = "redis"

    async def decide(self, key: str, limits: Limits) -> Decision:
        """Ask Redis; fall back to the local share within the deadline."""
        self.ensure_started()
        now = self.clock()
        args = (repr(limits.interval_s), repr(limits.tau_s), 1)
        decided: list[Decision] = []

        def late(result: Any) -> None:
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
        if decision.allowed:
            self.count_admitted(key, limits, now)
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
