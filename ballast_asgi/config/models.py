"""Configuration: small frozen value objects, validated once at the edge.

One ``GatewayConfig`` describes the whole stack. It is loaded from a YAML file
(``BALLAST_CONFIG``), then the environment (``BALLAST_UPSTREAM``,
``BALLAST_LIMITER``, ``BALLAST_FIXED_LIMIT``), then CLI flags, each layer
overriding the one before. Unknown keys are errors. Every error is turned into
one ``ConfigError`` line naming the key path and the allowed values.

All durations are in milliseconds (``*_ms``); ratios are in [0, 1].
The YAML may optionally nest everything under a top-level ``gateway:`` key.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from ballast_asgi.config.base import Frozen, check_url
from ballast_asgi.config.policy import (
    LIMITER_NAMES,
    AdmissionQueueConfig,
    BreakerConfig,
    CapacityConfig,
    GradientConfig,
    LimiterConfig,
    LimiterName,
    RetryConfig,
    ShedConfig,
)
from ballast_asgi.config.ratelimit import RateLimitConfig
from ballast_asgi.config.request import (
    DEFAULT_DEADLINE_STATUS,
    AdmissionConfig,
    BodyConfig,
    ConsumerConfig,
    PriorityConfig,
    PriorityRule,
    ProxyConfig,
)
from ballast_asgi.config.routes import (
    AutoRoutesConfig,
    RouteConfig,
    RouteLimiterConfig,
    RouteRateLimitConfig,
    check_routes,
)
from ballast_asgi.config.server import (
    AccessLogConfig,
    AdminConfig,
    ServerConfig,
    WebSocketConfig,
    WorkersConfig,
)
from ballast_asgi.config.upstreams import (
    MAX_INSTANCES,
    UPSTREAM_LIST_TAG,
    UPSTREAM_URL_TAG,
    CanaryConfig,
    CanaryRampConfig,
    DiscoveryConfig,
    EtcdConfig,
    HealthCheckConfig,
    OutlierConfig,
    UpstreamInstance,
    UpstreamsConfig,
    upstream_kind,
)

__all__ = [
    "DEFAULT_DEADLINE_STATUS",
    "LIMITER_NAMES",
    "MAX_INSTANCES",
    "UPSTREAM_LIST_TAG",
    "UPSTREAM_URL_TAG",
    "AccessLogConfig",
    "AdminConfig",
    "AdmissionConfig",
    "AdmissionQueueConfig",
    "AutoRoutesConfig",
    "BodyConfig",
    "BreakerConfig",
    "CanaryConfig",
    "CanaryRampConfig",
    "CapacityConfig",
    "ConsumerConfig",
    "DiscoveryConfig",
    "EtcdConfig",
    "GatewayConfig",
    "GradientConfig",
    "HealthCheckConfig",
    "LimiterConfig",
    "LimiterName",
    "OutlierConfig",
    "PriorityConfig",
    "PriorityRule",
    "ProxyConfig",
    "RateLimitConfig",
    "RetryConfig",
    "RouteConfig",
    "RouteLimiterConfig",
    "RouteRateLimitConfig",
    "ServerConfig",
    "ShedConfig",
    "UpstreamInstance",
    "UpstreamsConfig",
    "WebSocketConfig",
]


class GatewayConfig(Frozen):
    """The whole stack."""

    #: Upstream base URL, or a list of instances (URLs or {url, weight}; a
    #: comma-separated string too); required by the standalone gateway.
    upstream: (
        Annotated[
            Annotated[str, Tag(UPSTREAM_URL_TAG)]
            | Annotated[tuple[UpstreamInstance, ...], Tag(UPSTREAM_LIST_TAG)],
            Discriminator(upstream_kind),
        ]
        | None
    ) = None
    #: A hard cap on concurrent upstream requests (the fixed limiter's limit when
    #: ``limiter.fixed_limit`` is unset). It never chooses the algorithm here; in a
    #: config file without ``limiter.algorithm`` it does (``load.reference_layout``).
    max_concurrent_requests: int | None = Field(1_000, ge=1, le=100_000)
    load_shed_dry_run: bool = False
    proxy: ProxyConfig = ProxyConfig()
    admission: AdmissionConfig = AdmissionConfig()
    body: BodyConfig = BodyConfig()
    priority: PriorityConfig = PriorityConfig()
    admission_queue: AdmissionQueueConfig = AdmissionQueueConfig()
    limiter: LimiterConfig = LimiterConfig()
    breaker: BreakerConfig = BreakerConfig()
    retry: RetryConfig = RetryConfig()
    capacity: CapacityConfig = CapacityConfig()
    shed: ShedConfig = ShedConfig()
    admin: AdminConfig = AdminConfig()
    #: Follow instances registered in etcd instead of a fixed upstream (None: off).
    discovery: DiscoveryConfig | None = None
    server: ServerConfig = ServerConfig()
    websocket: WebSocketConfig = WebSocketConfig()
    access_log: AccessLogConfig = AccessLogConfig()
    workers: WorkersConfig = WorkersConfig()
    #: Per-key rate limits, local or shared through Redis (ballast_asgi/config/ratelimit.py).
    rate_limit: RateLimitConfig = RateLimitConfig()
    upstreams: UpstreamsConfig = UpstreamsConfig()
    #: Routes, the unit of policy (docs/routes.md): matched once per request, in order.
    routes: tuple[RouteConfig, ...] = ()
    #: Requests no route matches: grouped by first path segment, at most ``max_groups``.
    auto_routes: AutoRoutesConfig = AutoRoutesConfig()

    @field_validator("upstream", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str) and "," in v:
            v = [u.strip() for u in v.split(",") if u.strip()]
        if isinstance(v, list | tuple):
            if not 1 <= len(v) <= MAX_INSTANCES:
                raise ValueError(f"must list 1..{MAX_INSTANCES} instances, got {len(v)}")
            return tuple({"url": u} if isinstance(u, str) else u for u in v)
        return v

    canary: CanaryConfig = CanaryConfig()

    @field_validator("upstream")
    @classmethod
    def _url(
        cls, v: str | tuple[UpstreamInstance, ...] | None
    ) -> str | tuple[UpstreamInstance, ...] | None:
        if isinstance(v, tuple):
            urls = [i.url for i in v]
            if len(set(urls)) != len(urls):
                raise ValueError("lists the same instance URL twice")
            return v
        return None if v is None else check_url(v)

    @property
    def instances(self) -> tuple[UpstreamInstance, ...]:
        """The upstream as a list of instances (one for a single URL, none when unset)."""
        if self.upstream is None:
            return ()
        if isinstance(self.upstream, str):
            return (UpstreamInstance(url=self.upstream),)
        return self.upstream

    @model_validator(mode="after")
    def _routes(self) -> GatewayConfig:
        check_routes(self.routes, self.breaker, self.retry)
        return self

    @model_validator(mode="after")
    def _cap(self) -> GatewayConfig:
        if self.admission_queue.enabled and self.max_concurrent_requests is None:
            raise ValueError(
                "admission_queue.enabled requires max_concurrent_requests (1..100000): "
                "an uncapped gateway has nothing to queue for"
            )
        return self

    @property
    def fixed_limit(self) -> int:
        """The limit the fixed algorithm enforces."""
        if self.limiter.fixed_limit is not None:
            return self.limiter.fixed_limit
        return self.max_concurrent_requests or self.limiter.max_limit

    @property
    def max_limit(self) -> int:
        """The highest limit any algorithm may reach."""
        cap = self.max_concurrent_requests
        return self.limiter.max_limit if cap is None else min(cap, self.limiter.max_limit)
