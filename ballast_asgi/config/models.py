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

import ipaddress
import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from ballast_asgi.core import breaker as brk
from ballast_asgi.core.head import (
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    DEFAULT_MIN_RATE_BYTES_PER_S,
    DEFAULT_READ_TIMEOUT_MS,
    DEFAULT_REPLAY_MAX_BYTES,
)
from ballast_asgi.core.priority import Priority, parse_priority_name
from ballast_asgi.ratelimit.config import RateLimitConfig

#: The in-app handler stage's answer when a deadline passes while a handler runs.
DEFAULT_DEADLINE_STATUS = 504

LimiterName = Literal["gradient", "fixed", "aimd", "vegas", "gradient2"]
LIMITER_NAMES: tuple[str, ...] = ("gradient", "fixed", "aimd", "vegas", "gradient2")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _readable(path: str | None, key: str) -> str | None:
    if path is not None and not os.access(path, os.R_OK):
        raise ValueError(f"{key}: cannot read {path!r}")
    return path


def _check_cidrs(v: tuple[str, ...]) -> tuple[str, ...]:
    for cidr in v:
        try:
            ipaddress.ip_network(cidr.strip(), strict=False)
        except ValueError:
            raise ValueError(
                f"invalid CIDR {cidr!r}; expected an IPv4 or IPv6 network such as "
                "10.0.0.0/8 or fd00::/8"
            ) from None
    return v


class ProxyConfig(_Frozen):
    """The terminal proxy."""

    #: Upstream timeout when the request has no deadline.
    timeout_ms: int = Field(30_000, ge=1, le=3_600_000)
    connect_timeout_ms: int = Field(2_000, ge=1, le=600_000)
    #: Larger request bodies get 413 without an upstream call.
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=0, le=2**34)
    #: Which httpx transport the proxy uses by default.
    transport: Literal["aiohttp", "httpx"] = "aiohttp"
    max_connections: int = Field(1_000, ge=1, le=100_000)
    #: PEM file of CA certificates for https upstreams (None: the system's; always verified).
    ca_file: str | None = None
    #: Direct peers whose X-Forwarded-For / X-Forwarded-Proto are believed (CIDRs).
    #: Empty (the default): forwarded headers are passed on but believed for nothing.
    trusted_proxies: tuple[str, ...] = ()
    #: Idle pooled upstream connections are closed after this long, before the
    #: upstream's own keep-alive timeout can race a request (gunicorn 2 s, uvicorn 5 s).
    pool_idle_timeout_ms: int = Field(1_500, ge=1, le=3_600_000)
    #: Request bodies with a Content-Length up to this are read before the upstream
    #: call; larger and chunked ones stream upstream as they arrive.
    request_buffer_bytes: int = Field(64 * 1024, ge=0, le=2**34)
    #: A client that takes no response data for this long is disconnected (counted
    #: in ballast_client_send_timeouts_total).
    send_timeout_ms: int = Field(30_000, ge=1, le=3_600_000)
    #: Send the client's Host upstream instead of the upstream's (then redirects
    #: need no rewriting); by default Location headers are rewritten (redirects.py).
    preserve_host: bool = False

    @field_validator("ca_file")
    @classmethod
    def _ca(cls, v: str | None) -> str | None:
        return _readable(v, "proxy.ca_file")

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _check_cidrs(v)


class BodyConfig(_Frozen):
    """Request bodies: read before queueing, replayable up to a bound, never trickled."""

    #: Bodies up to this size are read before the request queues and replayed on retries;
    #: larger ones stream (one attempt).
    replay_max_bytes: int = Field(DEFAULT_REPLAY_MAX_BYTES, ge=0, le=2**30)
    #: Longest wait for the next body chunk (408 while buffering; cut off while streaming).
    read_timeout_ms: int = Field(DEFAULT_READ_TIMEOUT_MS, ge=1, le=600_000)
    #: After the first read_timeout_ms, the body must keep at least this average rate.
    min_rate_bytes_per_s: int = Field(DEFAULT_MIN_RATE_BYTES_PER_S, ge=1, le=2**30)


class AdmissionConfig(_Frozen):
    """Deadline admission."""

    #: Deadline given to requests without X-Deadline-Ms (None: no deadline).
    default_deadline_ms: int | None = Field(None, ge=1, le=86_400_000)
    #: Shed at admission a request whose budget is shorter than the minimum
    #: service time or its tier's expected queue wait.
    early_drop: bool = False
    #: In an app (install/wrap): cancel a handler whose deadline passes and answer
    #: ``deadline_status``.
    cancel_on_deadline: bool = True
    deadline_status: int = Field(DEFAULT_DEADLINE_STATUS, ge=400, le=599)
    #: More request header fields than this get 431 (0: no limit).
    max_headers: int = Field(DEFAULT_MAX_HEADERS, ge=0, le=10_000)
    #: More bytes of header names and values than this get 431 (0: no limit).
    max_header_bytes: int = Field(DEFAULT_MAX_HEADER_BYTES, ge=0, le=16 * 1024 * 1024)


class PriorityRule(_Frozen):
    """Classify by method and path pattern (fnmatch-style, e.g. ``/api/admin/*``)."""

    path: str = "*"
    methods: tuple[str, ...] = ()
    priority: Priority

    @field_validator("priority", mode="before")
    @classmethod
    def _tier(cls, v: Any) -> Any:
        return parse_priority_name(str(v)) if not isinstance(v, Priority) else v


class ConsumerConfig(_Frozen):
    """Classify by consumer: an API-key header mapped to a tier."""

    header: str = "x-api-key"
    keys: dict[str, Priority] = Field(default_factory=dict)

    @field_validator("keys", mode="before")
    @classmethod
    def _tiers(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            return {str(k): parse_priority_name(str(t)) for k, t in v.items()}
        return v


class PriorityConfig(_Frozen):
    """How a request's tier is chosen."""

    default: Priority = Priority.STANDARD
    #: Honour X-Priority from any client. Default true is the demo setting;
    #: production sets false and lists trusted_networks (see classify.py).
    trust_header: bool = True
    #: Honour X-Priority only from these networks (when trust_header is false).
    trusted_networks: tuple[str, ...] = ()
    rules: tuple[PriorityRule, ...] = ()
    consumers: ConsumerConfig = ConsumerConfig()

    @field_validator("default", mode="before")
    @classmethod
    def _tier(cls, v: Any) -> Any:
        return parse_priority_name(str(v)) if not isinstance(v, Priority) else v

    @field_validator("trusted_networks")
    @classmethod
    def _cidrs(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return _check_cidrs(v)


class AdmissionQueueConfig(_Frozen):
    """The priority queue with a LIFO tail (seed 003 key names)."""

    enabled: bool = True
    max_queue_size: int = Field(1_000, ge=1, le=10_000)
    #: Longest a request may wait for a permit (None: only its deadline bounds it).
    queue_timeout_ms: int | None = Field(None, ge=1, le=10_000)
    #: Reserve part of the queue for the critical tier.
    per_priority: bool = True
    #: Share of the queue only the critical tier may use (with per_priority).
    reserved_fraction: float = Field(0.5, ge=0.0, le=1.0)
    #: Within a tier: FIFO at or below this depth, newest first above it.
    lifo_threshold: int = Field(16, ge=0, le=10_000)


class LimiterConfig(_Frozen):
    """The concurrency limit algorithm and its bounds."""

    algorithm: LimiterName = "gradient"
    #: The limit of the fixed algorithm (defaults to max_concurrent_requests).
    fixed_limit: int | None = Field(None, ge=1, le=100_000)
    initial_limit: int = Field(20, ge=1, le=100_000)
    min_limit: int = Field(4, ge=1, le=100_000)
    max_limit: int = Field(1_000, ge=1, le=100_000)
    #: Sampling window of the adaptive algorithms.
    window_ms: int = Field(500, ge=10, le=60_000)

    @model_validator(mode="after")
    def _bounds(self) -> LimiterConfig:
        if self.min_limit > self.max_limit:
            raise ValueError(
                f"limiter.min_limit ({self.min_limit}) must be <= limiter.max_limit "
                f"({self.max_limit})"
            )
        if not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError(
                f"limiter.initial_limit ({self.initial_limit}) must be within "
                f"[min_limit, max_limit] = [{self.min_limit}, {self.max_limit}]"
            )
        return self


class BreakerConfig(_Frozen):
    """Circuit breaker."""

    enabled: bool = True
    window_ms: int = Field(brk.DEFAULT_WINDOW_MS, ge=100, le=600_000)
    failure_ratio: float = Field(brk.DEFAULT_FAILURE_RATIO, gt=0.0, le=1.0)
    min_calls: int = Field(brk.DEFAULT_MIN_CALLS, ge=1, le=100_000)
    consecutive_failures: int = Field(brk.DEFAULT_CONSECUTIVE_FAILURES, ge=1, le=100_000)
    open_ms: int = Field(brk.DEFAULT_OPEN_MS, ge=10, le=600_000)
    max_open_ms: int = Field(brk.DEFAULT_MAX_OPEN_MS, ge=10, le=3_600_000)
    half_open_successes: int = Field(brk.DEFAULT_HALF_OPEN_SUCCESSES, ge=1, le=1_000)
    probe_timeout_ms: int = Field(brk.DEFAULT_PROBE_TIMEOUT_MS, ge=1, le=600_000)
    failure_statuses: tuple[int, ...] = brk.DEFAULT_FAILURE_STATUSES
    #: One breaker per route template (in an app) or rule group, so one failing
    #: route cannot shed another's traffic; ``global``: one breaker for all.
    scope: Literal["route", "global"] = "route"

    @field_validator("failure_statuses")
    @classmethod
    def _statuses(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        bad = [s for s in v if not 400 <= s <= 599]
        if bad:
            raise ValueError(f"failure statuses must be 4xx or 5xx (400..599), got {bad}")
        return v

    @model_validator(mode="after")
    def _bounds(self) -> BreakerConfig:
        if self.open_ms > self.max_open_ms:
            raise ValueError("breaker.open_ms must be <= breaker.max_open_ms")
        return self


class RetryConfig(_Frozen):
    """Retries drawn from a budget."""

    enabled: bool = True
    #: Retries may be at most this share of original requests in the window.
    budget_ratio: float = Field(0.1, ge=0.0, le=1.0)
    window_ms: int = Field(10_000, ge=100, le=600_000)
    #: Retries always allowed per second, so a quiet service can still retry.
    min_retries_per_s: float = Field(1.0, ge=0.0, le=10_000.0)
    max_attempts: int = Field(3, ge=1, le=10)
    backoff_base_ms: int = Field(10, ge=0, le=60_000)
    backoff_max_ms: int = Field(200, ge=0, le=60_000)
    #: Buffer responses so a failed attempt can be replaced (streaming gives up retries).
    buffer_responses: bool = True
    #: Responses larger than this are streamed (and can no longer be retried).
    max_buffer_bytes: int = Field(4 * 1024 * 1024, ge=0, le=2**34)
    #: Upstream statuses worth another attempt (connect errors and timeouts always are).
    retry_statuses: tuple[int, ...] = (502, 503, 504)

    @field_validator("retry_statuses")
    @classmethod
    def _statuses(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        bad = [s for s in v if not 500 <= s <= 599]
        if bad:
            raise ValueError(f"retry statuses must be 5xx (500..599), got {bad}")
        return v


class CapacityConfig(_Frozen):
    """A cap on what the gateway holds in total."""

    #: In flight plus queued; beyond it a request is shed at once.
    max_held_requests: int = Field(4_096, ge=1, le=1_000_000)
    #: Request and response bytes buffered in memory.
    max_buffered_bytes: int = Field(128 * 1024 * 1024, ge=0, le=2**36)
    #: Share of max_held_requests only the critical tier may use.
    reserved_fraction: float = Field(0.1, ge=0.0, le=1.0)


class ShedConfig(_Frozen):
    """Shed responses."""

    status: int = Field(429, ge=400, le=599)
    #: Relative jitter applied to Retry-After.
    retry_after_jitter: float = Field(0.25, ge=0.0, le=1.0)


class AdminConfig(_Frozen):
    """Admin endpoints (see docs/security.md)."""

    #: Enables POST /_ballast/reload; required as a bearer token.
    token: str | None = None
    #: Serve /_ballast/* on the traffic port too (false: only on the admin port).
    on_traffic_port: bool = True
    #: Require the bearer token on every admin endpoint except health.
    token_required: bool = False

    @model_validator(mode="after")
    def _token(self) -> AdminConfig:
        if self.token_required and not self.token:
            raise ValueError("admin.token_required needs admin.token")
        return self


class ServerConfig(_Frozen):
    """The HTTP server under the ``ballast`` CLI (uvicorn; see docs/security.md)."""

    #: Close a connection idle this long between requests.
    keep_alive_ms: int = Field(5_000, ge=100, le=600_000)
    #: Close a connection whose request head is not complete this long after it began.
    header_timeout_ms: int = Field(10_000, ge=100, le=600_000)
    #: Request-head bytes (request line and headers) allowed before 431.
    max_header_bytes: int = Field(65_536, ge=1_024, le=16 * 1024 * 1024)
    #: Open connections (and running requests) above which uvicorn answers 503.
    max_connections: int = Field(10_000, ge=1, le=1_000_000)
    #: PEM certificate chain and key: serve TLS (https) on the traffic and admin ports.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: On SIGTERM: health answers 503 ``draining`` and traffic is still served this long.
    drain_grace_ms: int = Field(5_000, ge=0, le=600_000)
    #: Then the listener closes; in-flight and queued requests get this long to finish.
    shutdown_timeout_ms: int = Field(30_000, ge=0, le=3_600_000)

    @model_validator(mode="after")
    def _tls(self) -> ServerConfig:
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("server.ssl_keyfile needs server.ssl_certfile")
        for key in ("ssl_certfile", "ssl_keyfile"):
            _readable(getattr(self, key), f"server.{key}")
        return self


class WebSocketConfig(_Frozen):
    """WebSocket upgrades, proxied to the upstream (ballast_asgi/proxy/websocket.py)."""

    #: Proxy websocket upgrades; false: refuse them (403) with one log line each.
    enabled: bool = True
    #: Open websocket connections, counted apart from the concurrency limiter.
    max_connections: int = Field(1_000, ge=1, le=1_000_000)
    #: Share of max_connections only the critical tier may use.
    reserved_fraction: float = Field(0.1, ge=0.0, le=1.0)
    #: Largest message accepted from the upstream (the client side: uvicorn's --ws-max-size).
    max_message_bytes: int = Field(1_048_576, ge=1_024, le=64 * 1024 * 1024)
    #: Time allowed for the upstream's opening handshake.
    open_timeout_ms: int = Field(5_000, ge=1, le=600_000)


class AccessLogConfig(_Frozen):
    """The optional JSON access log (ballast_asgi/access_log.py)."""

    #: One JSON line per request on stdout (method, path, status, priority, shed
    #: reason, queue wait, upstream, duration).
    enabled: bool = False


class EtcdConfig(_Frozen):
    """The etcd cluster discovery uses."""

    #: Client URLs, ``http://HOST:PORT``; tried in turn when one fails.
    endpoints: tuple[str, ...] = Field(min_length=1, max_length=16)
    #: Deadline of each etcd call.
    timeout_ms: int = Field(2_000, ge=50, le=60_000)
    #: Key prefix under which the services live.
    prefix: str = "/ballast"

    @field_validator("endpoints")
    @classmethod
    def _endpoints(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        from ballast_asgi.discovery.model import parse_endpoint

        for url in v:
            parse_endpoint(url)
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not v.startswith("/") or v.endswith("/") or len(v) > 128:
            raise ValueError("must start and not end with '/' (at most 128 characters)")
        return v


class DiscoveryConfig(_Frozen):
    """Upstream instances registered in etcd (docs/discovery.md)."""

    etcd: EtcdConfig
    #: The service whose instances this gateway sends traffic to.
    service: str
    #: Run the leader-elected controller inside this gateway (docs/adr/0004).
    controller: bool = True
    #: Quiet time after a registration change before a version is written.
    debounce_ms: int = Field(50, ge=0, le=10_000)
    #: Longest a change waits under steady churn.
    max_wait_ms: int = Field(500, ge=0, le=60_000)
    #: How long an instance whose lease expired stays listed (a lost lease re-registers).
    removal_grace_ms: int = Field(2_000, ge=0, le=600_000)
    #: TTL of the controller election lease.
    election_ttl_s: int = Field(3, ge=1, le=300)

    @field_validator("service")
    @classmethod
    def _service(cls, v: str) -> str:
        from ballast_asgi.discovery.model import check_service

        return check_service(v)

    @model_validator(mode="after")
    def _wait(self) -> DiscoveryConfig:
        if self.max_wait_ms < self.debounce_ms:
            raise ValueError("discovery.max_wait_ms must be >= discovery.debounce_ms")
        return self


class UpstreamInstance(_Frozen):
    """One upstream instance: base URL and relative weight."""

    url: str
    #: Relative share of traffic (balancers draw in proportion to it).
    weight: float = Field(1.0, gt=0.0, le=1_000.0)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _check_url(v)


class HealthCheckConfig(_Frozen):
    """Active HTTP probes of each instance (pools only), off the request path."""

    enabled: bool = True
    #: Probed with GET; a 2xx/3xx within timeout_ms passes.
    path: str = "/health"
    interval_ms: int = Field(500, ge=10, le=600_000)
    timeout_ms: int = Field(1_000, ge=1, le=60_000)
    #: Passed probes in a row that bring an unhealthy instance back.
    healthy_threshold: int = Field(2, ge=1, le=100)
    #: Failed probes in a row that take a healthy instance out.
    unhealthy_threshold: int = Field(3, ge=1, le=100)
    #: Each delay is interval_ms * (1 +/- jitter), drawn at random.
    jitter: float = Field(0.1, ge=0.0, le=0.5)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/") or any(c in v for c in " \r\n#"):
            raise ValueError("must be a path starting with '/', e.g. /health")
        return v


class OutlierConfig(_Frozen):
    """Passive ejection from observed failures (see docs/pool.md)."""

    enabled: bool = True
    #: Gateway failures in a row (connect error, reset, timeout, 502/503/504) that eject.
    consecutive_failures: int = Field(5, ge=1, le=10_000)
    #: Success-rate rule: trailing window, evaluation period, minimum calls.
    window_ms: int = Field(2_000, ge=10, le=600_000)
    interval_ms: int = Field(250, ge=1, le=600_000)
    min_requests: int = Field(20, ge=1, le=1_000_000)
    #: Eject when the success rate is this far below the other instances' (and z-test).
    success_rate_gap: float = Field(0.2, gt=0.0, le=1.0)
    z: float = Field(3.0, ge=0.0, le=10.0)
    #: Ejection time: base * (ejections in a row), capped.
    base_ejection_ms: int = Field(5_000, ge=1, le=3_600_000)
    max_ejection_ms: int = Field(60_000, ge=1, le=3_600_000)
    #: At most this share of instances ejected at once (always at least one).
    max_ejection_percent: float = Field(50.0, ge=0.0, le=100.0)

    @model_validator(mode="after")
    def _bounds(self) -> OutlierConfig:
        if self.base_ejection_ms > self.max_ejection_ms:
            raise ValueError("upstreams.outlier.base_ejection_ms must be <= max_ejection_ms")
        return self


class UpstreamsConfig(_Frozen):
    """How a list of upstream instances is balanced and watched."""

    #: p2c (power of two choices) or round_robin, both weighted.
    balancer: Literal["p2c", "round_robin"] = "p2c"
    #: What p2c compares: requests in flight, or peak-EWMA RTT times that.
    scoring: Literal["least_outstanding", "peak_ewma"] = "least_outstanding"
    #: Below this share of routable instances, every instance is used.
    panic_threshold: float = Field(0.5, ge=0.0, le=1.0)
    #: Each instance gets its own limiter (the limiter section's algorithm).
    per_instance_limit: bool = True
    #: Each instance gets its own breaker (the breaker section's settings).
    per_instance_breaker: bool = True
    health_check: HealthCheckConfig = HealthCheckConfig()
    outlier: OutlierConfig = OutlierConfig()


def _check_url(v: str) -> str:
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:9101")
    return v.rstrip("/")


#: At most this many instances in one pool (bounds the metrics' instance label).
MAX_INSTANCES = 64
#: Union tags of ``upstream`` (left out of error locations by ``format_validation_error``).
UPSTREAM_URL_TAG = "url-string"
UPSTREAM_LIST_TAG = "instance-list"


def _upstream_kind(v: Any) -> str:
    return UPSTREAM_URL_TAG if isinstance(v, str) else UPSTREAM_LIST_TAG


class CanaryRampConfig(_Frozen):
    """Ramp steps for the canary's weight (empty: stay at ``canary.weight``)."""

    #: Increasing weights, e.g. [0.01, 0.05, 0.25, 0.5]; after the last step passes: promoted.
    steps: tuple[float, ...] = ()
    #: A step passes after this long...
    step_ms: int = Field(60_000, ge=1_000, le=86_400_000)
    #: ...and this many canary requests in it (low traffic waits).
    min_requests: int = Field(100, ge=0, le=10_000_000)

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0.0 < w <= 1.0 for w in v):
            raise ValueError("every step must be a weight in (0, 1]")
        if list(v) != sorted(v):
            raise ValueError("steps must not decrease")
        return v


class CanaryConfig(_Frozen):
    """A canary version beside the stable upstream, judged by a statistical rule."""

    #: The new version's URL; None: no canary.
    upstream: str | None = None
    #: Share of traffic the canary gets (without ramp steps).
    weight: float = Field(0.1, ge=0.0, le=1.0)
    rule: Literal["sequential", "fixed_horizon", "threshold"] = "sequential"
    #: False-rollback probability the rule allows (split 2/3 errors, 1/3 latency).
    alpha: float = Field(0.01, gt=0.0, le=0.2)
    #: Keep one user on one version by this header's or cookie's value (else X-Request-Id).
    sticky_header: str | None = None
    sticky_cookie: str | None = None
    #: Slow = over this quantile of the stable version's recent latency.
    latency_quantile: float = Field(0.99, ge=0.5, lt=1.0)
    #: The fixed_horizon rule's test time.
    horizon_ms: int = Field(600_000, ge=1_000, le=86_400_000)
    ramp: CanaryRampConfig = CanaryRampConfig()

    @field_validator("upstream")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return None
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:9201")
        return v.rstrip("/")


class GatewayConfig(_Frozen):
    """The whole stack."""

    #: Upstream base URL, or a list of instances (URLs or {url, weight}; a
    #: comma-separated string too); required by the standalone gateway.
    upstream: (
        Annotated[
            Annotated[str, Tag(UPSTREAM_URL_TAG)]
            | Annotated[tuple[UpstreamInstance, ...], Tag(UPSTREAM_LIST_TAG)],
            Discriminator(_upstream_kind),
        ]
        | None
    ) = None
    #: A hard cap on concurrent upstream requests (the fixed limiter's limit).
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
    #: Per-key rate limits, local or shared through Redis (ballast_asgi/ratelimit/config.py).
    rate_limit: RateLimitConfig = RateLimitConfig()
    upstreams: UpstreamsConfig = UpstreamsConfig()

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
        return None if v is None else _check_url(v)

    @property
    def instances(self) -> tuple[UpstreamInstance, ...]:
        """The upstream as a list of instances (one for a single URL, none when unset)."""
        if self.upstream is None:
            return ()
        if isinstance(self.upstream, str):
            return (UpstreamInstance(url=self.upstream),)
        return self.upstream

    @model_validator(mode="after")
    def _cap(self) -> GatewayConfig:
        if self.admission_queue.enabled and self.max_concurrent_requests is None:
            raise ValueError(
                "admission_queue.enabled requires max_concurrent_requests (1..100000): "
                "an uncapped gateway has nothing to queue for"
            )
        cap_only = "max_concurrent_requests" in self.model_fields_set
        if cap_only and "algorithm" not in self.limiter.model_fields_set:
            # The reference gateway's semantics: a bare cap *is* the fixed limiter.
            limiter = self.limiter.model_copy(update={"algorithm": "fixed"})
            object.__setattr__(self, "limiter", limiter)
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
