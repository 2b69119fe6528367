"""The pool: which instance an attempt goes to, and what its outcome teaches (pure).

``choose(now, exclude)`` returns a ``Lease`` on one instance:

1. *routable* instances are present, pass their probes, are not ejected and
   their breaker is not open (``Instance.routable``);
2. **panic mode**: when fewer than ``panic_threshold`` (default 0.5) of the
   instances are routable, all of them are eligible (better to spread load
   over instances that may be fine than to pile it on the last few);
3. instances named in ``exclude`` (already tried by this request) are left
   out unless nothing else is eligible;
4. instances whose own limiter has room are preferred; when none has, the
   pick overflows (it runs without a per-instance permit; the gateway-wide
   limit, the sum of the instance limits, keeps the total bounded);
5. the balancer picks one: power of two choices on outstanding requests
   (optionally peak-EWMA RTT), weighted; or smooth weighted round robin.

``settle(lease, outcome, now)`` releases the instance's permit with
``limiter_signal(outcome)``, settles its breaker ticket with
``breaker_verdict(outcome)`` and feeds the outlier detector (a deadline the
client asked for, or a client gone, is neutral everywhere).

``set_instances(specs)`` swaps the instance list (reload, discovery): kept URLs
keep their state, new ones start fresh, removed ones leave the rotation at
once and finish the attempts already out on them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ballast_asgi.core.breaker import Breaker
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.outcome import (
    AttemptOutcome,
    Verdict,
    breaker_verdict,
    limiter_signal,
)
from ballast_asgi.upstreams.balancer import SCORES, SmoothRoundRobin, p2c
from ballast_asgi.upstreams.health import HealthPolicy
from ballast_asgi.upstreams.instance import Instance, InstanceSpec, Lease
from ballast_asgi.upstreams.outlier import OutlierDetector, OutlierPolicy

#: Outcomes that count as a gateway failure for the consecutive rule.
_GATEWAY_FAILURES = frozenset(
    {AttemptOutcome.CONNECT_ERROR, AttemptOutcome.PROTOCOL_ERROR, AttemptOutcome.TIMEOUT}
)
GATEWAY_STATUSES = frozenset({502, 503, 504})


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


class Pool:
    """The upstream instances and the choice among them."""

    def __init__(
        self,
        specs: Sequence[InstanceSpec],
        *,
        make_limiter: Callable[[], Limiter],
        make_breaker: Callable[[], Breaker],
        policy: PoolPolicy | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not specs:
            raise ValueError("a pool needs at least one instance")
        self.policy = policy = policy if policy is not None else PoolPolicy()
        self.rng = rng if rng is not None else random.Random()
        self.detector = OutlierDetector(policy.outlier)
        self._make_limiter = make_limiter
        self._make_breaker = make_breaker
        self._rr = SmoothRoundRobin()
        self._score = SCORES[policy.scoring]
        self.instances: list[Instance] = []
        self.draining: list[Instance] = []
        self.panics = 0
        self.overflows = 0
        self.set_instances(specs)

    # -- membership -------------------------------------------------------------
    def set_instances(self, specs: Sequence[InstanceSpec]) -> None:
        """Replace the instance list, keeping the state of URLs that stay."""
        if not specs:
            raise ValueError("a pool needs at least one instance")
        old = {i.url: i for i in self.instances}
        fresh: list[Instance] = []
        for spec in specs:
            inst = old.pop(spec.url, None) or self._new(spec)
            inst.weight = spec.weight
            fresh.append(inst)
        for gone in old.values():
            gone.removed = True
            if gone.outstanding:
                self.draining.append(gone)
        self.instances = fresh
        self._rr.forget({i.key for i in fresh})

    def _new(self, spec: InstanceSpec) -> Instance:
        return Instance(
            spec,
            limiter=self._make_limiter(),
            breaker=self._make_breaker(),
            outlier=self.detector.new_state(),
        )

    # -- choosing ---------------------------------------------------------------
    def eligible(self, now: float) -> tuple[list[Instance], bool]:
        """The instances a pick may use now, and whether that is panic mode."""
        self.detector.evaluate([i.outlier for i in self.instances], now)
        routable = [i for i in self.instances if i.routable(now)]
        panic = not routable or len(routable) < self.policy.panic_threshold * len(self.instances)
        return (list(self.instances) if panic else routable), panic

    def choose(self, now: float, exclude: Collection[str] = ()) -> Lease:
        """A lease on one instance for one attempt (never refuses)."""
        pool, panic = self.eligible(now)
        if panic:
            self.panics += 1
        fresh = [i for i in pool if i.key not in exclude and i.url not in exclude] or pool
        with_room = [i for i in fresh if i.limiter.has_capacity()]
        if not with_room:
            self.overflows += 1
        inst = self._pick(with_room or fresh)
        permit = inst.limiter.try_acquire(now)
        ticket = inst.breaker.acquire(now)
        inst.outstanding += 1
        inst.requests += 1
        return Lease(inst, now, permit, ticket, panic)

    def _pick(self, candidates: Sequence[Instance]) -> Instance:
        if self.policy.balancer == "round_robin":
            return self._rr.pick(candidates, key=lambda i: i.key)
        return p2c(candidates, self.rng, self._score)

    # -- learning ---------------------------------------------------------------
    def body_ended(self, inst: Instance, complete: bool, now: float) -> None:
        """A response body after a good head ended whole or was cut by the upstream.

        A cut body turns that call into a failure in the outlier window and
        counts toward the instance's consecutive body failures (a whole body
        resets them), so an instance that resets mid-response is ejected like
        one that refuses connections, though its heads looked fine.
        """
        if inst.removed:
            return
        if not complete:
            inst.failures += 1
        self.detector.record_body(inst.outlier, [i.outlier for i in self.instances], now,
                                  complete=complete)  # fmt: skip

    def settle(
        self,
        lease: Lease,
        outcome: AttemptOutcome,
        now: float,
        *,
        status: int | None = None,
    ) -> None:
        """Report how the attempt ended (exactly once; a second call is ignored)."""
        if lease.settled:
            return
        lease.settled = True
        inst = lease.instance
        inst.outstanding -= 1
        if lease.permit is not None:
            lease.permit.release(limiter_signal(outcome), now)
        verdict = breaker_verdict(outcome)
        self._settle_ticket(lease, verdict, now)
        if verdict is Verdict.SUCCESS:
            inst.ewma.observe(max(0.0, now - lease.start), now)
        elif verdict is Verdict.FAILURE:
            inst.failures += 1
        if verdict is not Verdict.NEUTRAL and not inst.removed:
            self.detector.record(
                inst.outlier,
                [i.outlier for i in self.instances],
                now,
                failure=verdict is Verdict.FAILURE,
                gateway_failure=is_gateway_failure(outcome, status),
            )
        if inst.removed and inst.outstanding == 0 and inst in self.draining:
            self.draining.remove(inst)

    @staticmethod
    def _settle_ticket(lease: Lease, verdict: Verdict, now: float) -> None:
        ticket = lease.ticket
        if ticket is None or ticket.settled:
            return
        if verdict is Verdict.NEUTRAL:
            ticket.cancel()
        else:
            ticket.record(verdict is Verdict.SUCCESS, now)

    def record_probe(self, instance: Instance, passed: bool, error: str | None = None) -> bool:
        """Take one active probe result; True when the instance's health changed."""
        return instance.health.record(passed, self.policy.health, error)

    # -- reading ----------------------------------------------------------------
    def total_limit(self, now: float) -> int:
        """Sum of the limits of the eligible instances (the gateway-wide limit)."""
        pool, _ = self.eligible(now)
        return max(1, sum(i.limiter.limit for i in pool))

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """One JSON-safe entry per instance (for ``/snapshot``'s ``upstreams``)."""
        _, panic = self.eligible(now)
        return [_describe(i, now, panic) for i in self.instances]


def _describe(inst: Instance, now: float, panic: bool) -> dict[str, Any]:
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
