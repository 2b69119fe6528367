"""Compose once, reload as rebuild (ADR 0019): the gateway's stack as a function of its config.

Two kinds of objects make a gateway:

* **Live** pieces, built once from the first config and kept by every reload,
  because they hold state a reload must not lose: the connection pools (the
  proxy and its transport), the upstream pool (instances, their limits,
  ejections and probes), the discovery watcher, the canary's rollout and
  evidence, the rate-limit drivers (Redis connections), and the holders of
  in-flight and waiting requests (limiter permits and its learned limit,
  queue waiters, held-request counts, WebSocket connections).
* The **stack**: the stages around the proxy, the admin router and the
  access log, rebuilt whole by ``compose(config, live)`` at start-up, at
  every reload and at every discovery version that changes the instance
  count. The gateway swaps its reference to the new stack in one assignment;
  a request reads it once, so one in flight finishes on the stack it
  started on and its permit returns to the same (live) limiter.

``compose`` is the only place where config meets the live pieces: it applies
the config to the holders first (``reconfigure_parts`` with the pool's
facts: ``PoolLimit`` with per-instance limits, breakers scaled by the
instance count), then builds the chain. Nothing patches a built part
afterwards.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from ballast_asgi.canary.asgi import CanaryMiddleware, CanaryRuntime
from ballast_asgi.canary.pool import canary_urls
from ballast_asgi.config import GatewayConfig
from ballast_asgi.core.classify import Classifier
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.types import ASGIApp, Clock, Scope
from ballast_asgi.discovery.core.model import Instance
from ballast_asgi.discovery.runtime import DiscoveryRuntime
from ballast_asgi.gateway.lane import Lane
from ballast_asgi.gateway.parts import NO_POOL, Parts, PoolFacts, build_parts, reconfigure_parts
from ballast_asgi.gateway.pools import build_pool, canary_selector, pool_selector
from ballast_asgi.gateway.stack import build_stack
from ballast_asgi.middleware.pipeline import Pipeline
from ballast_asgi.ops.access_log import AccessLog
from ballast_asgi.ops.admin import AdminRouter
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.upstream import Selector, SingleUpstream, Upstream
from ballast_asgi.proxy.websocket import WebSocketProxy
from ballast_asgi.telemetry.metrics import Metrics
from ballast_asgi.upstreams.core.instance import InstanceSpec
from ballast_asgi.upstreams.core.limit import PoolLimit
from ballast_asgi.upstreams.runtime import DISCOVERY_PLACEHOLDER, PoolRuntime

#: Called with each discovery version's instances (the gateway swaps its stack).
OnVersion = Callable[[Sequence[Instance]], None]


@dataclass(eq=False)
class Live:
    """The long-lived pieces of one gateway (see the module docstring)."""

    metrics: Metrics
    clock: Clock
    rng: random.Random
    parts: Parts
    proxy_app: ProxyApp
    #: The terminal app: the proxy (with a pool, wrapped so lifespan runs its probes).
    proxy: ASGIApp
    websockets: WebSocketProxy
    pool: PoolRuntime | None = None
    discovery: DiscoveryRuntime | None = None
    canary: CanaryRuntime | None = None

    def pool_facts(self, config: GatewayConfig) -> PoolFacts:
        """What the limiter and breakers depend on besides ``config``: the pool now."""
        return _facts(config, self.pool)

    def set_instances(self, instances: Sequence[Instance]) -> None:
        """A discovery version: swap the pool's instances (kept URLs keep their state)."""
        assert self.pool is not None  # discovery always runs a pool
        self.pool.set_instances([InstanceSpec(i.url) for i in instances])


def _facts(config: GatewayConfig, pool: PoolRuntime | None) -> PoolFacts:
    if pool is None:
        return NO_POOL
    limit = None
    if config.upstreams.per_instance_limit:
        live, cap = pool.pool, config.max_concurrent_requests
        clock = pool.selector.clock

        def limit() -> PoolLimit:
            return PoolLimit(live, clock, cap)

    return PoolFacts(limit=limit, instances=len(pool.pool.instances))


def build_live(
    config: GatewayConfig,
    *,
    metrics: Metrics,
    clock: Clock,
    rng: random.Random,
    transport: httpx.AsyncBaseTransport | None,
    on_version: OnVersion,
) -> Live:
    """Build the live pieces from the first config (once per gateway)."""
    pool = _pool(config, metrics=metrics, clock=clock, rng=rng)
    parts = build_parts(config, metrics, clock=clock, rng=rng, pool=_facts(config, pool))
    discovery = None
    if config.discovery is not None:  # its versions swap the pool's instances
        discovery = DiscoveryRuntime(
            config.discovery, on_version, bootstrapped=bool(config.instances)
        )
        discovery.register_metrics(metrics.registry)
    stable: Selector = pool.selector if pool is not None else _single(config)
    canary = _canary(config, stable, metrics=metrics, clock=clock, rng=rng)
    proxy_app = ProxyApp(
        config=config.proxy, transport=transport, metrics=metrics, clock=clock,
        selector=canary.selector if canary is not None else stable,
    )  # fmt: skip
    websockets = WebSocketProxy(
        config=config.websocket,
        selector=proxy_app.selector,
        classifier=Classifier(config.priority),
        metrics=metrics,
        responder=parts.responder,
        ratelimit=parts.ratelimit,
        budget=parts.capacity.byte_budget if parts.capacity else None,
        default_priority=config.priority.default,
        clock=clock,
    )
    terminal = pool.wrap(proxy_app) if pool is not None else proxy_app
    return Live(metrics, clock, rng, parts, proxy_app, terminal, websockets, pool, discovery,
                canary)  # fmt: skip


def _single(config: GatewayConfig) -> Selector:
    return SingleUpstream(Upstream.parse(config.instances[0].url))


def _pool(
    config: GatewayConfig, *, metrics: Metrics, clock: Clock, rng: random.Random
) -> PoolRuntime | None:
    """The pool for a list of instances or for discovery (None for a single URL)."""
    if len(config.instances) < 2 and config.discovery is None:
        return None
    if not config.instances:  # discovery before its first version: never chosen (503)
        config = config.model_copy(update={"upstream": DISCOVERY_PLACEHOLDER})
    selector = pool_selector(build_pool(config, rng), config, clock)
    return PoolRuntime.build(
        selector, health_checks=config.upstreams.health_check.enabled, metrics=metrics, rng=rng
    )


def _canary(
    config: GatewayConfig, stable: Selector, *, metrics: Metrics, clock: Clock, rng: random.Random
) -> CanaryRuntime | None:
    urls = canary_urls(config.canary.upstream)
    if not urls:
        return None
    canary = canary_selector(urls, config, clock=clock, rng=rng)
    return CanaryRuntime(config.canary, stable, registry=metrics.registry, clock=clock, rng=rng,
                         canary=canary)  # fmt: skip


@dataclass(frozen=True, eq=False)
class Stack:
    """One config's chain: what a request runs through (swapped whole by a reload)."""

    config: GatewayConfig
    #: The outermost app (the admin router, or the access log around it).
    app: ASGIApp
    router: AdminRouter
    #: Requests outside the admin prefix go here directly (one coroutine level less,
    #: issue 18); None with the access log on (everything goes through it).
    direct: ASGIApp | None
    #: Serves the common proxied request with callbacks (``lane.py``); None: no lane
    #: (``server.lane`` off, or a stack it does not serve: see ``_lane``).
    lane: Lane | None = None


def compose(
    config: GatewayConfig,
    live: Live,
    admin: Callable[[ASGIApp], AdminRouter],
    *,
    previous: GatewayConfig | None = None,
) -> Stack:
    """The stack for ``config`` over ``live``; ``previous``: the config the live pieces
    were last configured for (None at start-up, when ``build_live`` just built them)."""
    if previous is not None:
        reconfigure_parts(live.parts, previous, config, live.clock(), pool=live.pool_facts(config))
        ws = live.websockets
        ws.reconfigure(config.websocket)
        ws.classifier = Classifier(config.priority)
        ws.default_priority = config.priority.default
    terminal: ASGIApp = live.proxy
    if live.canary is not None:
        c = config.canary
        terminal = CanaryMiddleware(terminal, live.canary.selector, header=c.version_header,
                                    cookie=c.signed_cookie,
                                    cookie_max_age_s=c.signed_cookie_max_age_s)  # fmt: skip
    logged = config.access_log.enabled
    inner = AccessLog.inner(terminal) if logged else terminal
    stack = build_stack(inner, live.parts, config, retries=True)
    if live.discovery is not None:  # lifespan starts it; 503 until a first version
        stack = live.discovery.wrap(stack)
    router = admin(stack)
    classify = _tier(live.websockets)
    app: ASGIApp = AccessLog(router, classify=classify) if logged else router
    return Stack(config, app, router, None if logged else stack, _lane(config, live, stack))


def _lane(config: GatewayConfig, live: Live, stack: ASGIApp) -> Lane | None:
    """The lane of a plain stack: the fused pipeline straight around the proxy (no access
    log, no discovery, no canary, no pool, no rate limit), ``server.lane`` on."""
    if not config.server.lane or not isinstance(stack, Pipeline):
        return None
    stages = stack.stages
    if stages.ratelimit is not None or stages.breaker.app is not live.proxy_app:
        return None
    if live.pool is not None or live.canary is not None or live.discovery is not None:
        return None
    return Lane(stack, live.proxy_app)


def _tier(websockets: WebSocketProxy) -> Callable[[Scope], str | None]:
    def tier(scope: Scope) -> str | None:
        """The tier of a request that never reached the terminal app (for the access log)."""
        client = scope.get("client")
        try:
            t, _ = websockets.classifier.classify(
                scope["method"], scope["path"], scope["headers"], client[0] if client else None
            )
        except HeaderError:
            return None
        return t.label

    return tier
