"""Config sections of one request's path: proxy, bodies, admission, priority."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from ballast_asgi.config.base import Frozen, check_cidrs, readable
from ballast_asgi.core.head import (
    DEFAULT_MAX_HEADER_BYTES,
    DEFAULT_MAX_HEADERS,
    DEFAULT_MIN_RATE_BYTES_PER_S,
    DEFAULT_READ_TIMEOUT_MS,
    DEFAULT_REPLAY_MAX_BYTES,
)
from ballast_asgi.core.priority import Priority, parse_priority_name

#: The in-app handler stage's answer when a deadline passes while a handler runs.
DEFAULT_DEADLINE_STATUS = 504


class ProxyConfig(Frozen):
    """The terminal proxy."""

    #: Upstream timeout when the request has no deadline.
    timeout_ms: int = Field(30_000, ge=1, le=3_600_000)
    connect_timeout_ms: int = Field(2_000, ge=1, le=600_000)
    #: Larger request bodies get 413 without an upstream call.
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=0, le=2**34)
    #: Which transport the proxy uses: lean (plain-http requests with an in-memory body
    #: on asyncio + httptools, the rest over aiohttp), aiohttp, or httpx's own pool.
    transport: Literal["lean", "aiohttp", "httpx"] = "lean"
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
    #: An upstream response head with more header fields than this gets 502 (Envoy's
    #: max_response_headers_count is 100).
    max_response_headers: int = Field(100, ge=1, le=10_000)
    #: ... or with more bytes of header names and values than this (nginx: "upstream sent
    #: too big header"); one field is also bounded by 64 KiB, a whole head read by
    #: the httpx transport by 100 KiB (httpcore's own limit).
    max_response_head_bytes: int = Field(64 * 1024, ge=1_024, le=256 * 1024)

    @field_validator("ca_file")
    @classmethod
    def _ca(cls, v: str | None) -> str | None:
        return readable(v, "proxy.ca_file")

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return check_cidrs(v)


class BodyConfig(Frozen):
    """Request bodies: read before queueing, replayable up to a bound, never trickled."""

    #: Bodies up to this size are read before the request queues and replayed on retries;
    #: larger ones stream (one attempt).
    replay_max_bytes: int = Field(DEFAULT_REPLAY_MAX_BYTES, ge=0, le=2**30)
    #: Longest wait for the next body chunk (408 while buffering; cut off while streaming).
    read_timeout_ms: int = Field(DEFAULT_READ_TIMEOUT_MS, ge=1, le=600_000)
    #: After the first read_timeout_ms, the body must keep at least this average rate.
    min_rate_bytes_per_s: int = Field(DEFAULT_MIN_RATE_BYTES_PER_S, ge=1, le=2**30)


class AdmissionConfig(Frozen):
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


class PriorityRule(Frozen):
    """Classify by method and path pattern (fnmatch-style, e.g. ``/api/admin/*``)."""

    path: str = "*"
    methods: tuple[str, ...] = ()
    priority: Priority

    @field_validator("priority", mode="before")
    @classmethod
    def _tier(cls, v: Any) -> Any:
        return parse_priority_name(str(v)) if not isinstance(v, Priority) else v


class ConsumerConfig(Frozen):
    """Classify by consumer: an API-key header mapped to a tier."""

    header: str = "x-api-key"
    keys: dict[str, Priority] = Field(default_factory=dict)

    @field_validator("keys", mode="before")
    @classmethod
    def _tiers(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            return {str(k): parse_priority_name(str(t)) for k, t in v.items()}
        return v


class PriorityConfig(Frozen):
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
        return check_cidrs(v)
