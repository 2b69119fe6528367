"""The canary as a pool: several instances of the new version, balanced like the stable pool.

``canary.upstream`` may be a list of URLs. With two or more, the canary side
of the split is a ``Pool`` built with the gateway's pool settings
(``upstreams.*``: balancer, per-instance limiter and breaker, passive outlier
ejection) behind a ``PoolSelector``. Active health probes are not started for
it: they need the gateway's lifespan, which runs the stable pool's, and the
judge should see a bad version's failures rather than have probes hide them.
The judge still compares versions, not instances; with several canary
instances an error burst on one of them is averaged with the others, as it is
on stable.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ballast_asgi.core.types import Clock
from ballast_asgi.proxy.upstream import Selector, SingleUpstream, Upstream
from ballast_asgi.upstreams.build import build_pool
from ballast_asgi.upstreams.runtime import LEASE_SLACK_S
from ballast_asgi.upstreams.selector import PoolSelector

if TYPE_CHECKING:
    from ballast_asgi.config import GatewayConfig


def canary_urls(upstream: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """``canary.upstream`` as a tuple of URLs (empty: no canary)."""
    if upstream is None:
        return ()
    return (upstream,) if isinstance(upstream, str) else upstream


def canary_selector(
    urls: Sequence[str], config: GatewayConfig | None, *, clock: Clock, rng: random.Random
) -> Selector:
    """One URL: a single upstream; several (and the gateway config): a pool over them."""
    if len(urls) == 1 or config is None:
        return SingleUpstream(Upstream.parse(urls[0]))
    from ballast_asgi.config.models import UpstreamInstance

    instances = tuple(UpstreamInstance(url=u) for u in urls)
    pool = build_pool(config.model_copy(update={"upstream": instances}), rng)
    max_lease_s = config.proxy.timeout_ms / 1000.0 + LEASE_SLACK_S
    return PoolSelector(pool, clock, max_lease_s=max_lease_s)


__all__ = ["canary_selector", "canary_urls"]
