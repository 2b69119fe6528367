"""Reloading the ``rate_limit`` section: limits, on/off, and a new driver (real redis-server)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ballast_asgi.gateway.embed import wrap
from ballast_asgi.ratelimit.lease import LeaseLimiter
from ballast_asgi.ratelimit.local import LocalLimiter
from experiments._harness.redis import RedisProcess, redis_server
from tests.fakes import FakeClock, StatusUpstream

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisProcess]:
    """One redis-server for the module, stopped by PID at the end."""
    with redis_server() as server:
        yield server


def _config(**section: Any) -> dict[str, Any]:
    return {"rate_limit": {"enabled": True, "key": "header:X-Tenant", **section}}


async def _codes(client: httpx.AsyncClient, n: int) -> list[int]:
    return [(await client.get("/", headers={"x-tenant": "t"})).status_code for _ in range(n)]


async def test_reload_changes_the_limit_and_switches_the_stage_off_and_on() -> None:
    """A new rate applies at once; ``enabled: false`` stops shedding; true brings it back."""
    clock = FakeClock()
    app = wrap(StatusUpstream(), _config(rate_per_s=1, burst=2), clock=clock)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw")
    async with client:
        assert await _codes(client, 3) == [200, 200, 429]
        app.handle.reload(_config(rate_per_s=1, burst=5))
        # The bucket state is kept (two spent): three more fit in a burst of five.
        assert await _codes(client, 4) == [200, 200, 200, 429]
        app.handle.reload(_config(enabled=False, rate_per_s=1, burst=5))
        assert await _codes(client, 5) == [200] * 5
        app.handle.reload(_config(rate_per_s=1, burst=5))
        assert await _codes(client, 1) == [429]
    assert isinstance(app.handle.ratelimit.limiter, LocalLimiter)


async def test_reload_to_a_shared_mode_starts_the_new_driver_and_closes_the_old(
    redis: RedisProcess,
) -> None:
    """local -> lease builds a driver that counts live gateways on its own; the old one closes."""
    prefix = uuid.uuid4().hex
    shared = {"mode": "lease", "redis_url": redis.url, "key_prefix": prefix,
              "redis_timeout_ms": 1000, "rate_per_s": 0.1, "burst": 3}  # fmt: skip
    peer = wrap(StatusUpstream(), _config(**shared))
    await peer.handle.ratelimit.start()  # another gateway, already in the heartbeat set
    app = wrap(StatusUpstream(), _config(rate_per_s=0.1, burst=3))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw")
    try:
        async with client:
            assert await _codes(client, 1) == [200]
            app.handle.reload(_config(**shared))
            runtime = app.handle.ratelimit
            assert isinstance(runtime.limiter, LeaseLimiter)
            await runtime.drain_background()  # the reload's start() and close() tasks
            assert runtime.limiter.live_gateways() == 2  # learned before any decision
            # A fresh shared bucket: its burst of three, not the local bucket's leftovers.
            assert await _codes(client, 4) == [200, 200, 200, 429]
            assert runtime.limiter.stats.decisions[("allowed", "degraded")] == 0
    finally:
        await app.handle.ratelimit.close()
        await peer.handle.ratelimit.close()
