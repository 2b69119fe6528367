"""The pool's policy and its reading of outcomes (pure).

``PoolPolicy`` says how the pool balances (``p2c`` or ``round_robin``, on
outstanding requests or peak-EWMA RTT), when it panics (``panic_threshold``)
and carries the outlier and health policies. ``is_gateway_failure`` tells the
consecutive-failure rule which outcomes are the gateway's kind of failure
(connect error, reset, timeout, 502/503/504; not a plain 500). ``Notify`` is the
shape of the state-change hook the pool calls (``events.emit``'s), and
``describe_instance`` an instance's ``/snapshot`` entry. The pool itself is
``pool.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.upstreams.core.health import HealthPolicy
from ballast_asgi.upstreams.core.instance import Instance
from ballast_asgi.upstreams.core.outlier import OutlierPolicy

#: Outcomes that count as a gateway failure for the consecutive rule.
_GATEWAY_FAILURES = frozenset(
    {AttemptOutcome.CONNECT_ERROR, AttemptOutcome.PROTOCOL_ERROR, AttemptOutcome.TIMEOUT}
)
GATEWAY_STATUSES = frozenset({502, 503, 504})
#: ``notify(event, level, key=..., **fields)``: one state change (``events.emit``'s shape).
Notify = Callable[..., object]


def silent(*_: object, **__: object) -> None:
    """The default ``notify``: tell nobody."""
    return None


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """How the pool balances and when it panics."""

    balancer: Literal["p2c", "round_robin"] = "p2c"
    scoring: Literal["least_outstanding", "peak_ewma"] = "least_outstanding"
    panic_threshold: float = 0.5
    outlier: OutlierPolicy = field(default_factory=OutlierPolicy)
    health: HealthPolicy = field(default_factory=HealthPolicy)


def is_gateway_failure(outcome: AttemptOutcome, status: int | None) -> bool:
    """Connect error, reset, timeout, or a 502/503/504 (not a plain 500)."""
    if outcome is AttemptOutcome.STATUS_5XX:
        return status is None or status in GATEWAY_STATUSES
    return outcome in _GATEWAY_FAILURES


def describe_instance(inst: Instance, now: float, panic: bool) -> dict[str, Any]:
    """One instance's JSON-safe ``/snapshot`` entry (``panic``: the pool's last pick panicked)."""
    ejected = inst.outlier.ejected(now)
    rate = inst.outlier.success_rate(now)
    return {
        "url": inst.key,
        "weight": inst.weight,
        "healthy": inst.health.healthy,
        "ejected": ejected,
        "ejected_until_s": round(inst.outlier.ejected_until - now, 3) if ejected else None,
        "ejections": inst.outlier.ejections,
        "routable": inst.routable(now),
        "panic": panic,
        "in_flight": inst.outstanding,
        "limit": inst.limiter.limit,
        "success_rate": None if rate is None else round(rate, 4),
        "requests": inst.requests,
        "failures": inst.failures,
        "breaker": inst.breaker.state(now).value,
        "rtt_ewma_ms": round(inst.rtt_ewma_s * 1000.0, 3),
        "probe_error": inst.health.last_error,
    }
