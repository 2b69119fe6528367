"""Config sections of the overload policy: queue, limiter, breaker, retries, caps, sheds.

Defaults live in the cores (``core/queue.py``, ``core/limit/base.py``,
``core/breaker.py``, ``core/retry_budget.py``, ``core/outcome.py``); these
models reference them and add the ranges a config file may ask for.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ballast_asgi.config.base import Frozen
from ballast_asgi.core import breaker as brk
from ballast_asgi.core import limiter as lim_mod
from ballast_asgi.core import queue as q
from ballast_asgi.core import retry_budget as rb
from ballast_asgi.core.limit import base as lim
from ballast_asgi.core.limit import gradient as grd
from ballast_asgi.core.limit import route_floors as rf
from ballast_asgi.core.outcome import DEFAULT_RETRY_STATUSES, ShedReason

LimiterName = Literal["gradient", "fixed", "aimd", "vegas", "gradient2"]
LIMITER_NAMES: tuple[str, ...] = ("gradient", "fixed", "aimd", "vegas", "gradient2")


class AdmissionQueueConfig(Frozen):
    """The priority queue with a LIFO tail (seed 003 key names)."""

    enabled: bool = True
    max_queue_size: int = Field(q.DEFAULT_MAX_SIZE, ge=1, le=10_000)
    #: Longest a request may wait for a permit (None: only its deadline bounds it).
    queue_timeout_ms: int | None = Field(None, ge=1, le=10_000)
    #: Reserve part of the queue for the critical tier.
    per_priority: bool = q.DEFAULT_PER_PRIORITY
    #: Share of the queue only the critical tier may use (with per_priority).
    reserved_fraction: float = Field(q.DEFAULT_RESERVED_FRACTION, ge=0.0, le=1.0)
    #: Within a tier: FIFO at or below this depth, newest first above it.
    lifo_threshold: int = Field(q.DEFAULT_LIFO_THRESHOLD, ge=0, le=10_000)


class GradientConfig(Frozen):
    """The gradient controller's rules (``limiter.gradient.*``, ADRs 0008-0012).

    Names and defaults are the core's (``core/limit/gradient.py``); the core's
    own checks run on the whole section (their messages name the key, located
    at ``limiter.gradient``). Used only when ``limiter.algorithm`` is ``gradient``.
    """

    queue_tolerance: float = Field(grd.DEFAULT_QUEUE_TOLERANCE, ge=1.0, le=10.0)
    queue_tolerance_binding: float = Field(grd.DEFAULT_QUEUE_TOLERANCE_BINDING, ge=1.0, le=10.0)
    slow_start_tolerance: float = Field(grd.DEFAULT_SLOW_START_TOLERANCE, ge=0.0, le=10.0)
    slow_start_step: float = Field(grd.DEFAULT_SLOW_START_STEP, ge=0.0, le=4.0)
    shrink_headroom: float = Field(grd.DEFAULT_SHRINK_HEADROOM, ge=0.0, le=10.0)
    rtt_percentile: float = Field(grd.DEFAULT_RTT_PERCENTILE, ge=0.0, le=1.0)
    tolerance: float = Field(grd.DEFAULT_TOLERANCE, ge=1.0, le=10.0)
    growth_factor: float = Field(grd.DEFAULT_GROWTH_FACTOR, ge=1.0, le=10.0)
    backoff_ratio: float = Field(grd.DEFAULT_BACKOFF_RATIO, gt=0.0, lt=1.0)
    min_gradient: float = Field(grd.DEFAULT_MIN_GRADIENT, gt=0.0, le=1.0)
    stuck_ratio: float = Field(grd.DEFAULT_STUCK_RATIO, gt=0.0, le=1.0)
    probe_interval_s: float = Field(grd.DEFAULT_PROBE_INTERVAL_S, ge=1.0, le=3600.0)
    #: Judge each sample against its own route's no-load RTT (ADR 0016).
    route_baselines: bool = True

    @model_validator(mode="after")
    def _core_checks(self) -> GradientConfig:
        try:
            grd.GradientLimit(**self.model_dump())
        except ValueError as exc:
            raise ValueError(str(exc)) from None  # located as "limiter.gradient: ..."
        return self


class LimiterConfig(Frozen):
    """The concurrency limit algorithm and its bounds.

    The algorithm is chosen by ``algorithm`` only (default ``gradient``). A
    config *file* that caps ``max_concurrent_requests`` without naming an
    algorithm means the fixed limiter: that rule lives in one place,
    ``config/load.py`` (``reference_layout``), not here.
    """

    algorithm: LimiterName = "gradient"
    #: The limit of the fixed algorithm (defaults to max_concurrent_requests).
    fixed_limit: int | None = Field(None, ge=1, le=100_000)
    initial_limit: int = Field(lim.DEFAULT_INITIAL_LIMIT, ge=1, le=100_000)
    min_limit: int = Field(lim.DEFAULT_MIN_LIMIT, ge=1, le=100_000)
    max_limit: int = Field(lim.DEFAULT_MAX_LIMIT, ge=1, le=100_000)
    #: Sampling window of the adaptive algorithms.
    window_ms: int = Field(lim.DEFAULT_WINDOW_MS, ge=10, le=60_000)
    #: Take the gateway's own event-loop lag out of every RTT sample (ADR 0010).
    subtract_loop_lag: bool = True
    #: One adaptive limit per route (ADR 0016; not with ``fixed``, nor with
    #: ``upstreams.per_instance_limit``): a slow or saturated endpoint cannot
    #: spend another endpoint's permits.
    partition_by_route: bool = True
    #: At most this many routes get their own limit; the rest share ``~other``.
    max_routes: int = Field(rf.DEFAULT_MAX_ROUTES, ge=2, le=1_024)
    #: The initial limit of a route first seen (or idle) while the gateway is quiet.
    quiet_limit: int = Field(lim_mod.DEFAULT_QUIET_LIMIT, ge=1, le=100_000)
    #: The gradient controller's rules (only with ``algorithm: gradient``).
    gradient: GradientConfig = GradientConfig()

    @model_validator(mode="after")
    def _bounds(self) -> LimiterConfig:
        lim.check_bounds(self.initial_limit, self.min_limit, self.max_limit, prefix="limiter.")
        return self


class BreakerConfig(Frozen):
    """Circuit breaker."""

    enabled: bool = brk.DEFAULT_ENABLED
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
    #: A 5xx, timeout or reset counts towards opening only while failures in the
    #: window come from at least this many distinct client addresses, so one
    #: client cannot open a breaker for others (connect errors always count:
    #: they do not depend on the request). 1: any client can (the old rule).
    min_failing_clients: int = Field(brk.DEFAULT_MIN_FAILING_CLIENTS, ge=1, le=1_000)

    @field_validator("failure_statuses")
    @classmethod
    def _statuses(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        bad = [s for s in v if not 500 <= s <= 599]
        if bad:
            raise ValueError(
                f"failure statuses must be 5xx (500..599): a 4xx is the request's fault and "
                f"never counts, got {bad}"
            )
        return v

    @model_validator(mode="after")
    def _bounds(self) -> BreakerConfig:
        if self.open_ms > self.max_open_ms:
            raise ValueError("breaker.open_ms must be <= breaker.max_open_ms")
        return self


class RetryConfig(Frozen):
    """Retries drawn from a budget."""

    enabled: bool = True
    #: Retries may be at most this share of original requests in the window.
    budget_ratio: float = Field(rb.DEFAULT_BUDGET_RATIO, ge=0.0, le=1.0)
    window_ms: int = Field(rb.DEFAULT_WINDOW_MS, ge=100, le=600_000)
    #: Retries always allowed per second, so a quiet service can still retry.
    min_retries_per_s: float = Field(rb.DEFAULT_MIN_RETRIES_PER_S, ge=0.0, le=10_000.0)
    max_attempts: int = Field(3, ge=1, le=10)
    backoff_base_ms: int = Field(10, ge=0, le=60_000)
    backoff_max_ms: int = Field(200, ge=0, le=60_000)
    #: Buffer responses so a failed attempt can be replaced (streaming gives up retries).
    buffer_responses: bool = True
    #: Responses larger than this are streamed (and can no longer be retried).
    max_buffer_bytes: int = Field(4 * 1024 * 1024, ge=0, le=2**34)
    #: Upstream statuses worth another attempt (connect errors and timeouts always are).
    retry_statuses: tuple[int, ...] = DEFAULT_RETRY_STATUSES

    @field_validator("retry_statuses")
    @classmethod
    def _statuses(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        bad = [s for s in v if not 500 <= s <= 599]
        if bad:
            raise ValueError(f"retry statuses must be 5xx (500..599), got {bad}")
        return v


class CapacityConfig(Frozen):
    """A cap on what the gateway holds in total."""

    #: In flight plus queued; beyond it a request is shed at once.
    max_held_requests: int = Field(4_096, ge=1, le=1_000_000)
    #: Request and response bytes buffered in memory.
    max_buffered_bytes: int = Field(128 * 1024 * 1024, ge=0, le=2**36)
    #: Share of max_held_requests only the critical tier may use.
    reserved_fraction: float = Field(0.1, ge=0.0, le=1.0)


class ShedConfig(Frozen):
    """Shed responses: overload sheds 429, unavailability (breaker_open) 503 by default."""

    #: The status of overload sheds (every reason but the unavailability ones).
    status: int = Field(429, ge=400, le=599)
    #: Per-reason statuses (``{reason: status}``, 400..599); ``breaker_open``
    #: defaults to 503 (the upstream is unavailable, not the client at fault).
    status_by_reason: dict[ShedReason, int] = Field(default_factory=dict)
    #: Relative jitter applied to Retry-After.
    retry_after_jitter: float = Field(0.25, ge=0.0, le=1.0)

    @field_validator("status_by_reason", mode="before")
    @classmethod
    def _reasons(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        allowed = ", ".join(r.value for r in ShedReason)
        for reason, status in v.items():
            if str(reason) not in {r.value for r in ShedReason}:
                raise ValueError(f"unknown shed reason {reason!r}; allowed: {allowed}")
            if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 599:
                raise ValueError(
                    f"status of {reason!r} must be an integer in 400..599, got {status!r}"
                )
        return v
