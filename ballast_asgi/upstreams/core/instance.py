"""One upstream instance and one attempt's hold on it (pure).

An ``Instance`` bundles what the pool knows about one URL: its weight, its own
concurrency limiter (``core.limiter.Limiter`` over a ``core.limit``
algorithm), its own breaker (``core.breaker.Breaker``), its probe record
(``health.HealthState``), its outlier record (``outlier.OutlierState``), a
peak-EWMA RTT and the attempts out on it. A ``Lease`` is one attempt: it holds
the instance's limiter permit and breaker ticket and is settled exactly once
with the attempt's ``AttemptOutcome`` (``Pool.settle``).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from ballast_asgi.core.breaker import Breaker, Ticket
from ballast_asgi.core.limiter import Limiter, Permit
from ballast_asgi.upstreams.core.balancer import PeakEwma
from ballast_asgi.upstreams.core.health import HealthState
from ballast_asgi.upstreams.core.outlier import OutlierState


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """A configured instance: base URL and relative weight."""

    url: str
    weight: float = 1.0


def display_url(url: str) -> str:
    """``url`` without userinfo (never shown in snapshots, metrics or logs)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class Instance:
    """Live state of one upstream instance."""

    __slots__ = (
        "breaker", "ewma", "failures", "health", "key", "limiter", "outlier",
        "outstanding", "removed", "requests", "url", "weight",
    )  # fmt: skip

    def __init__(
        self,
        spec: InstanceSpec,
        *,
        limiter: Limiter,
        breaker: Breaker,
        outlier: OutlierState,
        ewma_tau_s: float = 1.0,
    ) -> None:
        self.url = spec.url
        self.key = display_url(spec.url)
        self.weight = spec.weight
        self.limiter = limiter
        self.breaker = breaker
        self.outlier = outlier
        self.health = HealthState()
        self.ewma = PeakEwma(ewma_tau_s)
        self.outstanding = 0
        self.requests = 0
        self.failures = 0
        self.removed = False

    @property
    def rtt_ewma_s(self) -> float:
        """Peak-EWMA of the time to the response head."""
        return self.ewma.value_s

    def routable(self, now: float) -> bool:
        """In the rotation: present, passing probes, not ejected, breaker not open."""
        return (
            not self.removed
            and self.health.healthy
            and not self.outlier.ejected(now)
            and self.breaker.can_acquire(now)
        )


class Lease:
    """One attempt on one instance; settle it exactly once through the pool."""

    __slots__ = ("instance", "panic", "permit", "settled", "start", "ticket")

    def __init__(
        self,
        instance: Instance,
        start: float,
        permit: Permit | None,
        ticket: Ticket | None,
        panic: bool,
    ) -> None:
        self.instance = instance
        self.start = start
        self.permit = permit
        self.ticket = ticket
        #: Chosen in panic mode (too few healthy instances: all were eligible).
        self.panic = panic
        self.settled = False
