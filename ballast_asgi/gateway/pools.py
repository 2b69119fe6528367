"""Pools from the gateway config: the stable pool, an instance's limiter and breaker, the canary.

Composition glue (no I/O): it needs the configured limit algorithm
(``gateway.limits.make_algorithm``), so it lives with the composition, not in
``upstreams/`` (ADR 0005: no capability imports the composition). The old
path ``ballast_asgi.upstreams.build`` is an alias of this module.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ballast_asgi.core.breaker import Breaker
from ballast_asgi.core.limit import make_limit
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.types import Clock
from ballast_asgi.gateway.limits import make_algorithm
from ballast_asgi.proxy.upstream import Selector, SingleUpstream, Upstream
from ballast_asgi.telemetry.events import emit
from ballast_asgi.upstreams.core.health import HealthPolicy
from ballast_asgi.upstreams.core.instance import InstanceSpec
from ballast_asgi.upstreams.core.outlier import OutlierPolicy
from ballast_asgi.upstreams.core.pool import Pool, PoolPolicy
from ballast_asgi.upstreams.runtime import LEASE_SLACK_S
from ballast_asgi.upstreams.selector import PoolSelector

if TYPE_CHECKING:
    from ballast_asgi.config import GatewayConfig


def specs(config: GatewayConfig) -> list[InstanceSpec]:
    """The configured instances as pool specs."""
    return [InstanceSpec(i.url, i.weight) for i in config.instances]


def policy(config: GatewayConfig) -> PoolPolicy:
    """The pool policy described by ``config.upstreams``."""
    u = config.upstreams
    o = u.outlier
    h = u.health_check
    return PoolPolicy(
        balancer=u.balancer,
        scoring=u.scoring,
        panic_threshold=u.panic_threshold,
        outlier=OutlierPolicy(**o.model_dump()),
        health=HealthPolicy(**h.model_dump()),
    )


def build_pool(config: GatewayConfig, rng: random.Random) -> Pool:
    """A pool over ``config.instances`` with per-instance limiters and breakers."""
    return Pool(
        specs(config),
        make_limiter=lambda: instance_limiter(config, rng),
        make_breaker=lambda: instance_breaker(config),
        policy=policy(config),
        rng=rng,
        notify=emit,
    )


def instance_limiter(config: GatewayConfig, rng: random.Random) -> Limiter:
    """One instance's limiter: the limiter section's algorithm, or no real limit."""
    if not config.upstreams.per_instance_limit:
        return Limiter(make_limit("fixed", limit=config.max_limit))
    max_limit = config.max_limit
    algorithm = make_algorithm(config, rng)
    return Limiter(algorithm, max_limit=max_limit)


def instance_breaker(config: GatewayConfig) -> Breaker:
    """One instance's breaker: the breaker section's settings, or one that never opens.

    The pool reports results without the client address, so an instance's
    breaker counts every failure (``min_failing_clients = 1``); the per-route
    breakers in front of the pool are the ones no single client can open.
    """
    enabled = config.upstreams.per_instance_breaker and config.breaker.enabled
    update = {"enabled": enabled, "min_failing_clients": 1}
    return Breaker.from_config(config.breaker.model_copy(update=update))


def pool_selector(pool: Pool, config: GatewayConfig, clock: Clock) -> PoolSelector:
    """The proxy's selector over ``pool`` (leases reaped after the longest attempt)."""
    max_lease_s = config.proxy.timeout_ms / 1000.0 + LEASE_SLACK_S
    return PoolSelector(pool, clock, max_lease_s=max_lease_s)


def canary_selector(
    urls: Sequence[str], config: GatewayConfig, *, clock: Clock, rng: random.Random
) -> Selector:
    """The canary side: one URL, a single upstream; several, a pool built with the
    gateway's pool settings (``upstreams.*``; docs/canary.md, "The canary as a pool")."""
    if len(urls) == 1:
        return SingleUpstream(Upstream.parse(urls[0]))
    from ballast_asgi.config.models import UpstreamInstance

    instances = tuple(UpstreamInstance(url=u) for u in urls)
    pool = build_pool(config.model_copy(update={"upstream": instances}), rng)
    return pool_selector(pool, config, clock)
