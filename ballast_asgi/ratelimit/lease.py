"""``lease`` mode: take tokens from the shared bucket in batches, decide locally.

Per key a gateway holds a lease: whole tokens already taken from the shared
Redis bucket (so spending them needs no call) that lapse ``ttl_s`` after the
grant; unspent tokens then go back (``GIVE_BACK``). The batch size is what this
gateway spent recently in one lease window (``accounting.lease_size``), capped
by ``max_tokens`` (default: the larger of the burst and one window of the
rate, divided by the live gateways, so one gateway cannot hold the whole
bucket; Redis grants at most what the bucket holds).

When the lease falls below a quarter of its size a refill starts in the
background, so the request path rarely waits. A request that finds no tokens
waits for the refill at most ``redis_timeout_ms`` (not at all while the Redis
breaker refuses calls, or while Redis is failing: its last call ended in an
error; it is then decided on the gateway's share at once). When Redis grants nothing
the bucket is empty: the gateway refuses locally until Redis says a quarter
lease exists (no call in between), then asks again on its own. When Redis does not answer, the
request is decided on the gateway's share and charged back later.

Every lease call is also this gateway's heartbeat (``SharedBase.saw_beat``), so a
busy gateway makes no heartbeat trips of its own.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

from ballast_asgi.ratelimit.core.accounting import RateEstimate, lease_size
from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.core.table import KeyTable
from ballast_asgi.ratelimit.shared import Missed, SharedBase


@dataclass(slots=True, eq=False)
class Lease:
    """One key's lease on this gateway."""

    tokens: int = 0
    size: int = 0
    expires: float = 0.0
    empty_until: float = 0.0
    pending: asyncio.Future[None] | None = None
    demand: RateEstimate = field(default_factory=lambda: RateEstimate(0.5))


def _lease_debt(lease: Lease, now: float) -> bool:
    return lease.tokens > 0 or lease.pending is not None


class LeaseLimiter(SharedBase):
    """The ``lease`` mode driver."""

    mode = "lease"

    def __init__(
        self,
        *args: Any,
        window_s: float = 0.2,
        ttl_s: float = 0.5,
        min_tokens: int = 1,
        max_tokens: int | None = None,
        max_keys: int = 10_000,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, max_keys=max_keys, **kwargs)
        self.window_s = window_s
        self.ttl_s = ttl_s
        self.min_tokens = min_tokens
        self.max_tokens = max_tokens
        self.leases: KeyTable[Lease] = KeyTable(max_keys, _lease_debt)
        #: Keys holding unspent tokens, with the limits they were leased under.
        self._holding: dict[str, Limits] = {}

    def start_loops(self) -> None:
        """Give back expired leases of keys that went quiet."""
        self.spawn(self._every(self.ttl_s, self.sweep))

    async def sweep(self) -> None:
        """Return the tokens of every lease past its expiry."""
        now = self.clock()
        for key, limits in list(self._holding.items()):
            lease = self.leases.peek(key)
            if lease is None:
                self._holding.pop(key, None)
            elif now >= lease.expires:
                self._give_back(key, lease, limits)

    async def decide(self, key: str, limits: Limits) -> Decision:
        """Spend from the lease; refill (waiting at most the Redis timeout) when it is empty."""
        self.ensure_started()
        now = self.clock()
        lease = self.leases.get(key)
        if lease is None:
            lease = Lease()
            self.leases.put(key, lease, now)
        lease.demand.add(now)
        deadline = now + self.timeout_s
        while True:
            if lease.tokens > 0 and now >= lease.expires:
                self._give_back(key, lease, limits)
            if lease.tokens > 0:
                return self._spend(key, lease, limits, now)
            if now < lease.empty_until:
                self.stats.decided(False, "local")
                retry = lease.empty_until - now
                return Decision(False, 0, retry, retry, limits)
            if lease.pending is None:
                if self.breaker.refusing(now):
                    # Redis is known to be down (or its one probe is out): decide alone at
                    # once, no refill to wait for (waiting for one that fails at once still
                    # takes event-loop turns, which a busy gateway does not have).
                    return self.degrade(key, limits, now)
                lease.pending = asyncio.get_running_loop().create_future()
                self.spawn(self._refill(key, lease, limits))
            if self.failing:
                # Redis's last call failed: the refill goes out, but no request waits for it.
                return self.degrade(key, limits, now)
            try:
                await asyncio.wait_for(asyncio.shield(lease.pending), max(0.0, deadline - now))
            except (TimeoutError, Missed):
                return self.degrade(key, limits, self.clock())
            now = self.clock()
            if now >= deadline and lease.tokens == 0 and now >= lease.empty_until:
                return self.degrade(key, limits, now)

    def _spend(self, key: str, lease: Lease, limits: Limits, now: float) -> Decision:
        lease.tokens -= 1
        self.count_admitted(key, limits, now)
        if lease.tokens == 0:
            self._holding.pop(key, None)
        if lease.tokens * 4 < lease.size and lease.pending is None:
            lease.pending = asyncio.get_running_loop().create_future()
            self.spawn(self._refill(key, lease, limits))
        self.stats.decided(True, "local")
        return Decision(True, lease.tokens, 0.0, 0.0, limits)

    def size_for(self, lease: Lease, limits: Limits, now: float) -> int:
        """Tokens to ask for: recent spend over one window, within the bounds."""
        room = max(limits.burst, math.floor(limits.rate_per_s * self.window_s))
        cap = self.max_tokens or max(1, room // max(1, self.live))
        return lease_size(lease.demand.rate(now), self.window_s, self.min_tokens, cap)

    async def _refill(self, key: str, lease: Lease, limits: Limits) -> None:
        """One lease call; wakes every waiter (with ``Missed`` when Redis did not answer)."""
        future = lease.pending
        assert future is not None
        now = self.clock()
        want = self.size_for(lease, limits, now)
        self.stats.lease_requests += 1
        self.stats.last_lease_size = want
        keys = [self.key("b", key), self.key("gw")]
        args = [repr(limits.interval_s), repr(limits.tau_s), want, *self.beat_args()]
        try:
            granted, debt, live = await self.background("lease", keys, args)
        except Missed as exc:
            lease.pending = None
            future.set_exception(exc)
            future.exception()  # retrieved: waiters that timed out never see it
            return
        self.saw_beat(live)
        self._grant(key, lease, int(granted), float(debt), limits, want)
        lease.pending = None
        future.set_result(None)

    def _grant(
        self, key: str, lease: Lease, granted: int, debt: float, limits: Limits, want: int
    ) -> None:
        now = self.clock()
        self.stats.lease_tokens_granted += granted
        lease.size = max(want, 1)
        if granted:
            self._holding[key] = limits
            lease.tokens += granted
            lease.expires = now + self.ttl_s
            return
        # Wait for a worthwhile batch (a quarter lease), refusing locally meanwhile: the tokens
        # pile up in the shared bucket, none is lost. Then ask again before a request needs it.
        batch = max(self.min_tokens, min(limits.burst, want) // 4)
        wait = max(limits.interval_s, debt + batch * limits.interval_s - limits.tau_s)
        lease.empty_until = now + wait
        asyncio.get_running_loop().call_later(wait, self._refill_if_idle, key, lease, limits)

    def _refill_if_idle(self, key: str, lease: Lease, limits: Limits) -> None:
        if self._closed or lease.pending is not None or lease.tokens > 0:
            return
        if self.leases.peek(key) is not lease or lease.demand.rate(self.clock()) < 1.0:
            return
        lease.pending = asyncio.get_running_loop().create_future()
        self.spawn(self._refill(key, lease, limits))

    def _give_back(self, key: str, lease: Lease, limits: Limits) -> None:
        count, lease.tokens = lease.tokens, 0
        self._holding.pop(key, None)
        if count <= 0:
            return
        self.stats.lease_tokens_returned += count
        args = (repr(limits.interval_s), repr(limits.tau_s), count)
        self.spawn(self._quiet(self.bookkeeping("give_back", [self.key("b", key)], args)))

    async def _quiet(self, coro: Any) -> None:
        try:
            await coro
        except Missed:
            return

    def snapshot(self) -> dict[str, Any]:
        """The shared snapshot plus the lease table."""
        doc = super().snapshot()
        doc["lease_keys"] = self.leases.snapshot()
        return doc
