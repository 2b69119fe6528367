"""The live pool of a gateway: selector, probes, instance swaps, snapshot, metrics.

``PoolRuntime.build(selector, ...)`` wraps the pool the composition built
(``ballast_asgi.gateway.pools``) with its health checker and metrics; the
``ProxyApp`` asks the ``PoolSelector`` for each attempt's upstream, and
``wrap(app)`` has lifespan start and stop the probes (they also start at the
first request when no lifespan runs). ``set_instances`` swaps the list
(reload, discovery). How the gateway-wide limiter and breakers adapt to the
pool (``PoolLimit``, the breakers' consecutive-failure rule scaled by the
instance count) is decided by the composition, from the config and the
instance count, every time it builds a stack (``gateway/compose.py``).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from ballast_asgi.core.types import ASGIApp, Message, Receive, Scope, Send
from ballast_asgi.proxy.upstream import Selector
from ballast_asgi.telemetry.metrics import Metrics
from ballast_asgi.upstreams import metrics as pool_metrics
from ballast_asgi.upstreams.checker import HealthChecker
from ballast_asgi.upstreams.core.instance import InstanceSpec
from ballast_asgi.upstreams.core.pool import Notify, Pool
from ballast_asgi.upstreams.selector import PoolSelector

#: Stands in for the instances of a discovery gateway until its first config version.
DISCOVERY_PLACEHOLDER = "http://127.0.0.1:9"
#: Slack on top of the proxy's timeout before an unreported lease is reaped.
LEASE_SLACK_S = 5.0


class PoolRuntime:
    """The live pool of one gateway: built once, kept across reloads (its instances'
    limits, ejections and probe records are state, ADR 0019)."""

    def __init__(self, selector: PoolSelector, checker: HealthChecker | None) -> None:
        self.selector = selector
        self.pool = selector.pool
        self.checker = checker

    @classmethod
    def build(
        cls,
        selector: PoolSelector,
        *,
        health_checks: bool,
        metrics: Metrics,
        rng: random.Random,
    ) -> PoolRuntime:
        """The runtime around ``selector``'s pool: probes (``health_checks``), metrics."""
        pool = selector.pool
        pool.notify = _quiet_on_placeholder(pool)
        checker = HealthChecker(pool, rng=rng) if health_checks else None
        runtime = cls(selector, checker)
        selector.on_first_use(runtime.start_probes)
        pool_metrics.register(metrics.registry, lambda: runtime.pool, selector.clock)
        return runtime

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with lifespan also starting and stopping the probes."""
        return _WithProbes(app, self)

    # -- probes -----------------------------------------------------------------
    def start_probes(self) -> None:
        """Start (or re-sync) the probe tasks; needs a running loop."""
        if self.checker is not None:
            self.checker.sync()

    async def stop_probes(self) -> None:
        """Stop the probe tasks and close their client."""
        if self.checker is not None:
            await self.checker.aclose()

    def set_instances(self, specs: Sequence[InstanceSpec]) -> None:
        """Swap the instance list atomically: kept URLs keep their state, new ones start
        fresh, removed ones leave the rotation and settle what they have out."""
        self.selector.set_instances(list(specs))
        if self.checker is not None and self.checker.started:
            self.checker.sync()

    def snapshot(self) -> list[dict[str, Any]]:
        """The ``upstreams`` list of ``/snapshot`` (empty while discovery's placeholder
        stands in: it is never chosen, so it is not listed as healthy or routable)."""
        if _placeholder_only(self.pool):
            return []
        return self.pool.snapshot(self.selector.clock())

    def summary(self) -> dict[str, Any]:
        """``/snapshot``'s ``pool``: panic mode and the warnings an operator should see;
        ``waiting_for_discovery`` until discovery applies its first version."""
        return {
            "panic": self.pool.in_panic,
            "warnings": self.degraded(),
            "waiting_for_discovery": _placeholder_only(self.pool),
        }

    def degraded(self) -> list[str]:
        """Reasons for health ``degraded`` (every instance failing its probes)."""
        if _placeholder_only(self.pool):
            return []
        return [f"upstreams: {w}" for w in self.pool.warnings()]


class _WithProbes:
    """Passes everything to the proxy; lifespan also starts and stops the probes."""

    def __init__(self, app: ASGIApp, runtime: PoolRuntime) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def watch() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.runtime.start_probes()
            elif message["type"] == "lifespan.shutdown":
                await asyncio.shield(self.runtime.stop_probes())
            return message

        await self.app(scope, watch, send)


def _placeholder_only(pool: Pool) -> bool:
    return all(i.url == DISCOVERY_PLACEHOLDER for i in pool.instances)


def _quiet_on_placeholder(pool: Pool) -> Notify:
    """The pool's events, without those about discovery's placeholder instance."""
    notify = pool.notify

    def send(event: str, level: str, **fields: Any) -> object:
        if _placeholder_only(pool):
            return None
        return notify(event, level, **fields)

    return send


def plain_snapshot(selector: Selector) -> list[dict[str, Any]]:
    """The ``upstreams`` list without a pool (one URL, or discovery's list): nothing watched."""
    ups = selector.upstreams()
    return [{"url": u.display, "weight": 1.0, "healthy": None, "ejected": False, "pool": False}
            for u in ups]  # fmt: skip
