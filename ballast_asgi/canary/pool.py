"""The canary as a pool: several instances of the new version, balanced like the stable pool.

``canary.upstream`` may be a list of URLs. With two or more, the canary side
of the split is a ``Pool`` built with the gateway's pool settings
(``upstreams.*``: balancer, per-instance limiter and breaker, passive outlier
ejection) behind a ``PoolSelector``; the composition builds it
(``ballast_asgi.gateway.pools.canary_selector``) and hands it to
``CanaryRuntime``. Active health probes are not started for it: they need the
gateway's lifespan, which runs the stable pool's, and the judge should see a
bad version's failures rather than have probes hide them. The judge still
compares versions, not instances; with several canary instances an error
burst on one of them is averaged with the others, as it is on stable.
"""

from __future__ import annotations


def canary_urls(upstream: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """``canary.upstream`` as a tuple of URLs (empty: no canary)."""
    if upstream is None:
        return ()
    return (upstream,) if isinstance(upstream, str) else upstream


__all__ = ["canary_urls"]
