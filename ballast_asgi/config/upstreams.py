"""Config sections of where traffic goes: instances, the pool, discovery, the canary."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from ballast_asgi.config.base import Frozen, check_url
from ballast_asgi.config.canary import CanarySequentialConfig
from ballast_asgi.upstreams.core.health import HealthPolicy
from ballast_asgi.upstreams.core.outlier import OutlierPolicy
from ballast_asgi.upstreams.core.pool_policy import PoolPolicy

#: The cores' defaults, referenced by the sections below (one default per value, ADR 0007).
_HEALTH, _OUTLIER, _POOL = HealthPolicy(), OutlierPolicy(), PoolPolicy()


class EtcdConfig(Frozen):
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
        from ballast_asgi.discovery.core.model import parse_endpoint

        for url in v:
            parse_endpoint(url)
        return v

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        if not v.startswith("/") or v.endswith("/") or len(v) > 128:
            raise ValueError("must start and not end with '/' (at most 128 characters)")
        return v


class DiscoveryConfig(Frozen):
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
        from ballast_asgi.discovery.core.model import check_service

        return check_service(v)

    @model_validator(mode="after")
    def _wait(self) -> DiscoveryConfig:
        if self.max_wait_ms < self.debounce_ms:
            raise ValueError("discovery.max_wait_ms must be >= discovery.debounce_ms")
        return self


class UpstreamInstance(Frozen):
    """One upstream instance: base URL and relative weight."""

    url: str
    #: Relative share of traffic (balancers draw in proportion to it).
    weight: float = Field(1.0, gt=0.0, le=1_000.0)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_url(v)


class HealthCheckConfig(Frozen):
    """Active HTTP probes of each instance (pools only), off the request path."""

    enabled: bool = _HEALTH.enabled
    #: Probed with GET within timeout_ms; what passes is ``expect``.
    path: str = _HEALTH.path
    #: below_500: any answer below 500 passes (an app without this path answers 404 and
    #: stays in); 2xx: only 2xx/3xx (an app with a real health endpoint).
    expect: Literal["below_500", "2xx"] = _HEALTH.expect
    interval_ms: int = Field(_HEALTH.interval_ms, ge=10, le=600_000)
    timeout_ms: int = Field(_HEALTH.timeout_ms, ge=1, le=60_000)
    #: Passed probes in a row that bring an unhealthy instance back.
    healthy_threshold: int = Field(_HEALTH.healthy_threshold, ge=1, le=100)
    #: Failed probes in a row that take a healthy instance out.
    unhealthy_threshold: int = Field(_HEALTH.unhealthy_threshold, ge=1, le=100)
    #: Each delay is interval_ms * (1 +/- jitter), drawn at random.
    jitter: float = Field(_HEALTH.jitter, ge=0.0, le=0.5)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/") or any(c in v for c in " \r\n#"):
            raise ValueError("must be a path starting with '/', e.g. /health")
        return v


class OutlierConfig(Frozen):
    """Passive ejection from observed failures (see docs/pool.md)."""

    enabled: bool = _OUTLIER.enabled
    #: Gateway failures in a row (connect error, reset, timeout, 502/503/504) that eject.
    consecutive_failures: int = Field(_OUTLIER.consecutive_failures, ge=1, le=10_000)
    #: Success-rate rule: trailing window, evaluation period, minimum calls.
    window_ms: int = Field(_OUTLIER.window_ms, ge=10, le=600_000)
    interval_ms: int = Field(_OUTLIER.interval_ms, ge=1, le=600_000)
    min_requests: int = Field(_OUTLIER.min_requests, ge=1, le=1_000_000)
    #: Eject when the success rate is this far below the other instances' (and z-test).
    success_rate_gap: float = Field(_OUTLIER.success_rate_gap, gt=0.0, le=1.0)
    z: float = Field(_OUTLIER.z, ge=0.0, le=10.0)
    #: Ejection time: base * (ejections in a row), capped.
    base_ejection_ms: int = Field(_OUTLIER.base_ejection_ms, ge=1, le=3_600_000)
    max_ejection_ms: int = Field(_OUTLIER.max_ejection_ms, ge=1, le=3_600_000)
    #: At most this share of instances ejected at once (always at least one).
    max_ejection_percent: float = Field(_OUTLIER.max_ejection_percent, ge=0.0, le=100.0)

    @model_validator(mode="after")
    def _bounds(self) -> OutlierConfig:
        if self.base_ejection_ms > self.max_ejection_ms:
            raise ValueError("upstreams.outlier.base_ejection_ms must be <= max_ejection_ms")
        return self


class UpstreamsConfig(Frozen):
    """How a list of upstream instances is balanced and watched."""

    #: p2c (power of two choices) or round_robin, both weighted.
    balancer: Literal["p2c", "round_robin"] = _POOL.balancer
    #: What p2c compares: requests in flight, or peak-EWMA RTT times that.
    scoring: Literal["least_outstanding", "peak_ewma"] = _POOL.scoring
    #: Below this share of routable instances, every instance is used.
    panic_threshold: float = Field(_POOL.panic_threshold, ge=0.0, le=1.0)
    #: Each instance gets its own limiter (the limiter section's algorithm).
    per_instance_limit: bool = True
    #: Each instance gets its own breaker (the breaker section's settings).
    per_instance_breaker: bool = True
    health_check: HealthCheckConfig = HealthCheckConfig()
    outlier: OutlierConfig = OutlierConfig()


#: The shortest ``canary.salt`` accepted.
MIN_SALT_CHARS = 16
#: At most this many instances in one pool (bounds the metrics' instance label).
MAX_INSTANCES = 64
#: Union tags of ``upstream`` (left out of error locations by ``format_validation_error``).
UPSTREAM_URL_TAG = "url-string"
UPSTREAM_LIST_TAG = "instance-list"


def upstream_kind(v: Any) -> str:
    return UPSTREAM_URL_TAG if isinstance(v, str) else UPSTREAM_LIST_TAG


class CanaryRampConfig(Frozen):
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


class CanaryConfig(Frozen):
    """A canary version beside the stable upstream, judged by a statistical rule."""

    #: The new version's URL, or a list of URLs (a pool); None: no canary.
    upstream: str | tuple[str, ...] | None = None
    #: Share of traffic the canary gets (without ramp steps).
    weight: float = Field(0.1, ge=0.0, le=1.0)
    rule: Literal["sequential", "fixed_horizon", "threshold"] = "sequential"
    #: False-rollback probability the rule allows (split by sequential.error_share).
    alpha: float = Field(0.01, gt=0.0, le=0.2)
    #: Keep one user on one version by this header's or cookie's value (else: each
    #: request its own draw). The value is hashed under ``salt``, so a client cannot
    #: compute which values land on the canary.
    sticky_header: str | None = None
    sticky_cookie: str | None = None
    #: Let X-Request-Id keep a request on its version (off: a client picks its ids).
    sticky_request_id: bool = False
    #: Issue a signed cookie of this name that keeps a client on its version
    #: (an id the gateway drew + a MAC under ``salt``: kept, never chosen). Wins over
    #: sticky_cookie/sticky_header. None: off.
    signed_cookie: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    #: The signed cookie's Max-Age.
    signed_cookie_max_age_s: int = Field(86_400, ge=60, le=31_536_000)
    #: The split's secret (>= 16 characters; or BALLAST_CANARY_SALT). None: 32 random
    #: bytes per gateway start (its workers share them). Set it so several gateways agree.
    salt: SecretStr | None = None
    #: Add X-Ballast-Version: stable|canary to responses.
    version_header: bool = True
    #: Outcomes of one client (resolved address) the judge counts per 1 s block.
    max_outcomes_per_client: int = Field(100, ge=1, le=1_000_000)
    #: Clients tracked per block; later ones share one entry (and its cap).
    max_clients: int = Field(10_000, ge=1, le=1_000_000)
    #: Slow = over this quantile of the stable version's recent latency.
    latency_quantile: float = Field(0.99, ge=0.5, lt=1.0)
    #: The fixed_horizon rule's test time.
    horizon_ms: int = Field(600_000, ge=1_000, le=86_400_000)
    ramp: CanaryRampConfig = CanaryRampConfig()
    sequential: CanarySequentialConfig = CanarySequentialConfig()

    @field_validator("upstream")
    @classmethod
    def _url(cls, v: str | tuple[str, ...] | None) -> str | tuple[str, ...] | None:
        if v is None or isinstance(v, str):
            return None if v is None else _canary_url(v)
        if not v:
            raise ValueError("a list of canary URLs must not be empty (use null for no canary)")
        urls = tuple(_canary_url(u) for u in v)
        return urls[0] if len(urls) == 1 else urls

    @model_validator(mode="after")
    def _salt(self) -> CanaryConfig:
        # after-validation: the error's input is the section, never the secret itself
        if self.salt is not None and len(self.salt.get_secret_value()) < MIN_SALT_CHARS:
            raise ValueError(f"salt must be at least {MIN_SALT_CHARS} characters (not shown)")
        return self


def _canary_url(v: str) -> str:
    return check_url(v)
