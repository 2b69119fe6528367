"""Composing a pool into the gateway: selector, probes, limits, breaker, snapshot, metrics, reload.

``PoolRuntime.build(config, ...)`` returns None for a single upstream URL (the
gateway then proxies to it as before). For a list it builds the pool, its
health checker and a ``PoolSelector`` that the ``ProxyApp`` asks for each
attempt's upstream; ``app`` is that proxy, wrapped so that lifespan starts
and stops the probes (they also start at the first request when no lifespan
runs). ``attach(parts)`` adapts the gateway-wide collaborators:

* the gateway-wide limiter enforces the sum of the instances' own limits
  (``PoolLimit``) when each instance has an adaptive limit of its own;
* the gateway's breakers' (one per route) consecutive-failure rule is
  multiplied by the number of instances, so one broken instance (whose
  failures arrive interleaved with the others' successes, and are ejected
  after a few) cannot open one; the failure-ratio rule opens it when the pool
  as a whole fails.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

import httpx

from ballast_asgi.core.types import ASGIApp, Clock, Message, Receive, Scope, Send
from ballast_asgi.gateway.routing import build_breakers
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.upstream import Selector
from ballast_asgi.telemetry.metrics import Metrics
from ballast_asgi.upstreams import metrics as pool_metrics
from ballast_asgi.upstreams.build import build_pool, specs
from ballast_asgi.upstreams.checker import HealthChecker
from ballast_asgi.upstreams.core.limit import PoolLimit
from ballast_asgi.upstreams.core.pool import Notify, Pool
from ballast_asgi.upstreams.selector import PoolSelector

if TYPE_CHECKING:
    from ballast_asgi.config import GatewayConfig
    from ballast_asgi.gateway.stack import Parts

#: Stands in for the instances of a discovery gateway until its first config version.
DISCOVERY_PLACEHOLDER = "http://127.0.0.1:9"
#: Slack on top of the proxy's timeout before an unreported lease is reaped.
LEASE_SLACK_S = 5.0


class PoolRuntime:
    """The live pool of one gateway."""

    def __init__(
        self,
        selector: PoolSelector,
        checker: HealthChecker | None,
        proxy: ProxyApp,
        config: GatewayConfig,
    ) -> None:
        self.selector = selector
        self.pool = selector.pool
        self.checker = checker
        self.proxy = proxy
        self.config = config
        self.app: ASGIApp = _WithProbes(proxy, self)

    @classmethod
    def build(
        cls,
        config: GatewayConfig,
        *,
        metrics: Metrics,
        clock: Clock,
        rng: random.Random,
        transport: httpx.AsyncBaseTransport | None = None,
        discovered: bool = False,
    ) -> PoolRuntime | None:
        """The runtime for a list of instances (or for discovery), or None for a single URL."""
        if len(config.instances) < 2 and not discovered:
            return None
        if not config.instances:  # discovery before its first version: never chosen (503)
            config = config.model_copy(update={"upstream": DISCOVERY_PLACEHOLDER})
        pool = build_pool(config, rng)
        pool.notify = _quiet_on_placeholder(pool)
        checker = HealthChecker(pool, rng=rng) if config.upstreams.health_check.enabled else None
        max_lease_s = config.proxy.timeout_ms / 1000.0 + LEASE_SLACK_S
        selector = PoolSelector(pool, clock, max_lease_s=max_lease_s)
        proxy = ProxyApp(
            config=config.proxy, transport=transport, metrics=metrics, clock=clock,
            selector=selector,
        )  # fmt: skip
        runtime = cls(selector, checker, proxy, config)
        selector.on_first_use(runtime.start_probes)
        pool_metrics.register(metrics.registry, lambda: runtime.pool, clock)
        return runtime

    # -- probes -----------------------------------------------------------------
    def start_probes(self) -> None:
        """Start (or re-sync) the probe tasks; needs a running loop."""
        if self.checker is not None:
            self.checker.sync()

    async def stop_probes(self) -> None:
        """Stop the probe tasks and close their client."""
        if self.checker is not None:
            await self.checker.aclose()

    # -- the gateway-wide parts ---------------------------------------------------
    def attach(self, parts: Parts, *, breaker: bool = True) -> None:
        """Adapt the gateway-wide limiter and breaker to the pool (see the module docstring)."""
        cfg = self.config
        if cfg.upstreams.per_instance_limit and cfg.limiter.algorithm != "fixed":
            parts.limiter.set_algorithm(
                PoolLimit(self.pool, self.selector.clock, cfg.max_concurrent_requests),
                max_limit=cfg.max_concurrent_requests,
            )
        if breaker:
            n = len(self.pool.instances)
            parts.breakers = build_breakers(cfg, parts.route_table(), consecutive_scale=n)

    def reload(self, new: GatewayConfig, parts: Parts, *, discovered: bool = False) -> None:
        """Apply a new config to the pool without dropping a request.

        Without discovery the instance list comes from ``new``; with discovery
        it is the applied version's and stays. Either way the gateway-wide
        limiter and breaker are adapted to the pool again, since
        ``reconfigure_parts`` rebuilt them from plain config when their keys
        changed. The breaker keeps its state unless its settings or the number
        of instances changed.
        """
        old, self.config = self.config, new
        if not discovered:
            self.selector.set_instances(specs(new))
            if self.checker is not None and self.checker.started:
                self.checker.sync()
        same_count = discovered or len(new.instances) == len(old.instances)
        same_policy = (new.breaker, new.routes, new.auto_routes) == (
            old.breaker,
            old.routes,
            old.auto_routes,
        )
        same = same_policy and same_count
        self.attach(parts, breaker=not same)

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
