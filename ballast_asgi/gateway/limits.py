"""Config to limit algorithms: the gateway-wide algorithm and the per-route partitions.

``make_algorithm`` builds the configured algorithm bounded by the config's
caps (also each pool instance's own limit, ``gateway/pools.py``);
``make_partition`` the per-route factory (ADR 0016) and ``own_routes`` which
routes get one. Pure functions of the config (and the rng they hand on).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from ballast_asgi.config import GatewayConfig
from ballast_asgi.core.limit import LimitAlgorithm, make_limit


def make_partition(
    config: GatewayConfig, rng: random.Random
) -> Callable[[bool], LimitAlgorithm] | None:
    """The per-route algorithm factory (ADR 0016), or None for one limit.

    With an upstream pool and ``upstreams.per_instance_limit`` there is none:
    the per-instance limits are the partitions (``PoolLimit``, ``limiter_for``).
    """
    lc = config.limiter
    if lc.algorithm == "fixed" or not (lc.partition_by_route or own_routes(config)):
        return None

    def build(quiet: bool) -> LimitAlgorithm:
        initial = max(lc.initial_limit, lc.quiet_limit) if quiet else lc.initial_limit
        return make_algorithm(config, rng, initial_limit=initial)

    return build


def own_routes(config: GatewayConfig) -> frozenset[str] | None:
    """Routes with a partition of their own: None (every route) with
    ``limiter.partition_by_route``, else the configured routes that ask for one."""
    if config.limiter.partition_by_route:
        return None
    return frozenset(r.name for r in config.routes if r.limiter.partition)


def make_algorithm(
    config: GatewayConfig, rng: random.Random, *, initial_limit: int | None = None
) -> LimitAlgorithm:
    """The configured limit algorithm, bounded by the config's caps."""
    lc = config.limiter
    if lc.algorithm == "fixed":
        return make_limit("fixed", limit=config.fixed_limit)
    max_limit = config.max_limit
    rules = lc.gradient.model_dump() if lc.algorithm == "gradient" else {}
    initial = lc.initial_limit if initial_limit is None else initial_limit
    return make_limit(
        lc.algorithm,
        initial_limit=min(initial, max_limit),
        min_limit=min(lc.min_limit, max_limit),
        max_limit=max_limit,
        window_ms=lc.window_ms,
        rng=rng,
        **rules,
    )
