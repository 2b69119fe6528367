"""The ``rate_limit`` config section (validated at load; mounted in ``config/models.py``).

Pinned keys: ``enabled``, ``mode``, ``redis_url`` (env ``BALLAST_REDIS_URL``
overrides), ``key``, ``rate_per_s``, ``burst``. The rest tunes the modes; every
duration is in milliseconds.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

RateLimitMode = Literal["local", "redis", "lease", "sync"]
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RateLimitRoute(_Frozen):
    """A named rule: its name is the ``route`` key; it may set its own limits."""

    name: str
    path: str = "*"
    methods: tuple[str, ...] = ()
    rate_per_s: float | None = Field(None, gt=0, le=10_000_000)
    burst: int | None = Field(None, ge=1, le=10_000_000)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-64 characters from A-Z a-z 0-9 _ . -")
        return v

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        fnmatch.translate(v)
        return v


class RateLimitOverride(_Frozen):
    """Limits for one key value (e.g. one tenant); burst defaults to the section's."""

    value: str = Field(min_length=1, max_length=128)
    rate_per_s: float = Field(gt=0, le=10_000_000)
    burst: int | None = Field(None, ge=1, le=10_000_000)


class LeaseConfig(_Frozen):
    """``lease`` mode: how many tokens a gateway takes at once and for how long."""

    #: A lease is what this gateway spent recently in this much time.
    window_ms: int = Field(200, ge=1, le=60_000)
    #: Unspent tokens go back this long after the grant.
    ttl_ms: int = Field(500, ge=1, le=600_000)
    min_tokens: int = Field(1, ge=1, le=1_000_000)
    #: Default (null): the larger of the burst and one window of the rate, divided by
    #: the live gateways (Redis never grants more than the bucket holds).
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)


class RedisBreakerConfig(_Frozen):
    """When a gateway stops asking Redis and decides on its own share."""

    #: ``rebuilt``: ratio and count over a window, one probe; ``naive``: N misses in a row.
    kind: Literal["rebuilt", "naive"] = "rebuilt"
    window_ms: int = Field(100, ge=1, le=60_000)
    failure_ratio: float = Field(0.5, gt=0.0, le=1.0)
    min_failures: int = Field(5, ge=1, le=10_000)
    open_ms: int = Field(100, ge=1, le=600_000)
    #: ``naive`` only: misses in a row that open it.
    naive_misses: int = Field(3, ge=1, le=10_000)


class RateLimitConfig(_Frozen):
    """Rate limits per key, per process (``local``) or shared through Redis."""

    enabled: bool = False
    mode: RateLimitMode = "local"
    redis_url: str = "redis://127.0.0.1:6379/0"
    #: client_ip | consumer | route | header:NAME
    key: str = "client_ip"
    rate_per_s: float = Field(1000.0, gt=0, le=10_000_000)
    burst: int = Field(100, ge=1, le=10_000_000)
    #: Longest a request waits for Redis before deciding on this gateway's share.
    redis_timeout_ms: float = Field(2.0, gt=0, le=10_000)
    #: ``sync`` mode: reconcile period.
    sync_interval_ms: int = Field(200, ge=5, le=60_000)
    #: ``redis`` mode: how often, per key, a gateway publishes its recent demand; its own
    #: share of the limit (used when it decides without Redis) follows that demand.
    demand_ms: int = Field(200, ge=5, le=60_000)
    #: Live-gateway heartbeats (a gateway counts as live for three periods, at least 3 s).
    heartbeat_ms: int = Field(1000, ge=50, le=60_000)
    #: Keys kept per process (least recently used evicted beyond).
    max_keys: int = Field(10_000, ge=1, le=10_000_000)
    key_prefix: str = Field("ballast:rl", min_length=1, max_length=64)
    #: Charge what was admitted without Redis to the shared bucket afterwards.
    charge_back: bool = True
    routes: tuple[RateLimitRoute, ...] = ()
    overrides: tuple[RateLimitOverride, ...] = ()
    #: ``all``: RateLimit-Policy/RateLimit on every response of a limited key;
    #: ``refused``: only on the 429s.
    headers: Literal["all", "refused"] = "all"
    lease: LeaseConfig = LeaseConfig()
    breaker: RedisBreakerConfig = RedisBreakerConfig()

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        if v in ("client_ip", "consumer", "route"):
            return v
        if v.startswith("header:") and re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", v[7:]):
            return v
        raise ValueError("must be client_ip, consumer, route or header:NAME (a header name)")

    @field_validator("redis_url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("redis", "rediss", "unix") or not (parts.hostname or parts.path):
            raise ValueError("must be a redis://host:port/db, rediss:// or unix:// URL")
        return v
