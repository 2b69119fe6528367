"""Build the configured rate limiter and key resolver from ``RateLimitConfig``."""

from __future__ import annotations

import time
from typing import Any, Protocol

from ballast_asgi.config.ratelimit import RateLimitConfig
from ballast_asgi.core.types import Clock
from ballast_asgi.ratelimit.client import RedisClient
from ballast_asgi.ratelimit.core.breaker import Breaker, NaiveBreaker, RedisBreaker
from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.core.keys import KeyResolver, Route
from ballast_asgi.ratelimit.lease import LeaseLimiter
from ballast_asgi.ratelimit.local import LocalLimiter
from ballast_asgi.ratelimit.redis_mode import RedisLimiter
from ballast_asgi.ratelimit.stats import RateLimitStats
from ballast_asgi.ratelimit.sync import SyncLimiter


class RateLimiter(Protocol):
    """What the middleware and the metrics need from any mode's driver."""

    mode: str
    stats: RateLimitStats

    async def decide(self, key: str, limits: Limits) -> Decision:
        """Admit or refuse one request for ``key``."""
        ...

    async def start(self) -> None:
        """Start background work and learn the live gateways (bounded; never raises)."""
        ...

    async def close(self) -> None:
        """Stop background work and release connections."""
        ...

    def live_gateways(self) -> int:
        """Gateways sharing the limit, as last seen."""
        ...

    def breaker_state(self) -> str:
        """closed, open or half_open."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """JSON-safe state for ``/snapshot``."""
        ...


def make_breaker(config: RateLimitConfig) -> Breaker:
    """The Redis breaker the config names."""
    b = config.breaker
    if b.kind == "naive":
        return NaiveBreaker(misses=b.naive_misses, open_s=1.0)
    return RedisBreaker(
        window_s=b.window_ms / 1000,
        failure_ratio=b.failure_ratio,
        min_failures=b.min_failures,
        open_s=b.open_ms / 1000,
    )


def make_limiter(config: RateLimitConfig, *, clock: Clock = time.monotonic) -> RateLimiter:
    """The driver for ``config.mode``."""
    if config.mode == "local":
        return LocalLimiter(max_keys=config.max_keys, clock=clock)
    common: dict[str, Any] = {
        "prefix": config.key_prefix,
        "timeout_s": config.redis_timeout_ms / 1000,
        "max_keys": config.max_keys,
        "breaker": make_breaker(config),
        "heartbeat_s": config.heartbeat_ms / 1000,
        "charge_back": config.charge_back,
        "clock": clock,
    }
    client = RedisClient(config.redis_url)
    if config.mode == "redis":
        return RedisLimiter(client, demand_s=config.demand_ms / 1000, **common)
    if config.mode == "sync":
        return SyncLimiter(client, interval_s=config.sync_interval_ms / 1000, **common)
    lc = config.lease
    return LeaseLimiter(
        client,
        window_s=lc.window_ms / 1000,
        ttl_s=lc.ttl_ms / 1000,
        min_tokens=lc.min_tokens,
        max_tokens=lc.max_tokens,
        **common,
    )


def make_resolver(config: RateLimitConfig, consumer_header: str = "x-api-key") -> KeyResolver:
    """The key resolver: key kind, default limits, routes, overrides."""
    default = Limits(config.rate_per_s, config.burst)
    routes = [
        Route(
            r.name,
            r.path,
            r.methods,
            Limits(r.rate_per_s or config.rate_per_s, r.burst or config.burst, r.name)
            if (r.rate_per_s or r.burst)
            else None,
        )
        for r in config.routes
    ]
    overrides = {
        o.value: Limits(o.rate_per_s, o.burst or config.burst, "override") for o in config.overrides
    }
    return KeyResolver(
        config.key,
        default,
        routes=routes,
        overrides=overrides,
        consumer_header=consumer_header,
    )
