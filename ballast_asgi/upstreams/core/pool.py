"""The pool: which instance an attempt goes to, and what its outcome teaches (pure).

``choose(now, exclude)`` returns a ``Lease`` on one instance:

1. *routable* instances are present, pass their probes, are not ejected and
   their breaker is not open (``Instance.routable``);
2. **panic mode**: when fewer than ``panic_threshold`` (default 0.5) of the
   instances are routable, every instance that is not ejected and whose
   breaker is not open is eligible, whatever its probes say (better to spread
   load over instances that may be fine than to pile it on the last few);
   only when that leaves none are all of them eligible. Passive evidence from
   real requests still rules in panic: an ejected instance is never chosen
   while another one is not;
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

State changes are reported through the injected ``notify`` (the gateway
passes ``ballast_asgi.telemetry.events.emit``): an instance ejected or restored, failing
or passing its probes, every instance failing its probes, panic mode entered
or left. The pool stays pure: it only calls the hook.

The policy value (``PoolPolicy``), what counts as a gateway failure and the
``Notify`` hook's type and an instance's ``/snapshot`` entry are in
``pool_policy.py`` (importable from here too).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from typing import Any

from ballast_asgi.core.breaker import Breaker
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.outcome import (
    AttemptOutcome,
    Verdict,
    breaker_verdict,
    limiter_signal,
)
from ballast_asgi.upstreams.core.balancer import SCORES, SmoothRoundRobin, p2c
from ballast_asgi.upstreams.core.instance import Instance, InstanceSpec, Lease
from ballast_asgi.upstreams.core.outlier import OutlierDetector
from ballast_asgi.upstreams.core.pool_policy import (
    GATEWAY_STATUSES,
    Notify,
    PoolPolicy,
    describe_instance,
    is_gateway_failure,
    silent,
)


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
        notify: Notify = silent,
    ) -> None:
        if not specs:
            raise ValueError("a pool needs at least one instance")
        self.notify = notify
        #: Keys of the instances last seen ejected, and whether the last pick panicked.
        self._out: set[str] = set()
        self.in_panic = False
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
        for state in self.detector.evaluate([i.outlier for i in self.instances], now):
            self._ejected(
                next(i for i in self.instances if i.outlier is state), now, "success_rate"
            )
        self._restored(now)
        routable = [i for i in self.instances if i.routable(now)]
        panic = not routable or len(routable) < self.policy.panic_threshold * len(self.instances)
        self._panic_changed(panic, len(routable))
        if not panic:
            return routable, False
        alive = [i for i in self.instances
                 if not i.outlier.ejected(now) and i.breaker.can_acquire(now)]  # fmt: skip
        return (alive or list(self.instances)), True

    def _ejected(self, inst: Instance, now: float, rule: str) -> None:
        self._out.add(inst.key)
        seconds = round(inst.outlier.ejected_until - now, 3)
        self.notify("pool.instance_ejected", "warning", key=inst.key, instance=inst.key,
                    rule=rule, ejection_s=seconds, ejections=inst.outlier.ejections)  # fmt: skip

    def _restored(self, now: float) -> None:
        if not self._out:
            return
        for inst in self.instances:
            if inst.key in self._out and not inst.outlier.ejected(now):
                self._out.discard(inst.key)
                self.notify("pool.instance_restored", "info", key=inst.key, instance=inst.key,
                            ejections=inst.outlier.ejections)  # fmt: skip
        self._out &= {i.key for i in self.instances}

    def _panic_changed(self, panic: bool, routable: int) -> None:
        if panic == self.in_panic:
            return
        self.in_panic = panic
        event, level = ("pool.panic_enter", "warning") if panic else ("pool.panic_leave", "info")
        self.notify(event, level, routable=routable, instances=len(self.instances),
                    panic_threshold=self.policy.panic_threshold)  # fmt: skip

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
        if self.detector.record_body(inst.outlier, [i.outlier for i in self.instances], now,
                                     complete=complete):  # fmt: skip
            self._ejected(inst, now, "consecutive_body")

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
            ejected = self.detector.record(
                inst.outlier,
                [i.outlier for i in self.instances],
                now,
                failure=verdict is Verdict.FAILURE,
                gateway_failure=is_gateway_failure(outcome, status),
            )
            if ejected:
                self._ejected(inst, now, "consecutive")
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
        was_all = self.all_failing_probes()
        changed = instance.health.record(passed, self.policy.health, error)
        if not changed:
            return False
        h = self.policy.health
        if passed:
            self.notify("pool.instance_healthy", "info", key=instance.key, instance=instance.key)
        else:
            self.notify("pool.instance_unhealthy", "warning", key=instance.key,
                        instance=instance.key, error=error, probe=h.path, expect=h.expect,
                        failed_in_a_row=h.unhealthy_threshold)  # fmt: skip
        now_all = self.all_failing_probes()
        if now_all and not was_all:
            self.notify("pool.all_failing_probes", "error", instances=len(self.instances),
                        probe=h.path, expect=h.expect, error=error)  # fmt: skip
        elif was_all and not now_all:
            self.notify("pool.probes_recovered", "info", instance=instance.key)
        return True

    def all_failing_probes(self) -> bool:
        """Whether every instance currently fails its active probes."""
        return bool(self.instances) and not any(i.health.healthy for i in self.instances)

    def warnings(self) -> list[str]:
        """Conditions an operator should know of (``/snapshot``'s ``pool.warnings``)."""
        if not self.all_failing_probes():
            return []
        h = self.policy.health
        return [
            f"every instance fails its health probe (GET {h.path}, expect {h.expect}): the pool "
            "runs in panic mode; check upstreams.health_check.path and .expect"
        ]

    # -- reading ----------------------------------------------------------------
    def total_limit(self, now: float) -> int:
        """Sum of the limits of the eligible instances (the gateway-wide limit)."""
        pool, _ = self.eligible(now)
        return max(1, sum(i.limiter.limit for i in pool))

    def snapshot(self, now: float) -> list[dict[str, Any]]:
        """One JSON-safe entry per instance (for ``/snapshot``'s ``upstreams``)."""
        _, panic = self.eligible(now)
        return [describe_instance(i, now, panic) for i in self.instances]


__all__ = ["GATEWAY_STATUSES", "Notify", "Pool", "PoolPolicy", "is_gateway_failure"]
