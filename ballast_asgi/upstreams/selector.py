"""The pool behind the proxy's selector seam (adapter).

``PoolSelector`` implements ``ballast_asgi.proxy.upstream.Selector``:
``choose(ctx, exclude)`` takes a lease from the pool (``exclude``: the
upstreams this request already tried, so a retry goes elsewhere) and returns
the instance's parsed ``Upstream``; ``report(upstream, outcome, rtt_s, now)``
settles one open lease on that instance. The seam reports by upstream, not by
lease, so the lease settled is the one whose start best matches
``now - rtt_s`` (the oldest without an RTT): leases on the same instance that
started together are interchangeable, so the limiter's samples stay exact.

A lease never reported (an attempt cancelled between the choice and its
head, e.g. the client went away) would hold its instance's permit forever:
leases older than ``max_lease_s`` (the proxy's longest attempt plus slack)
are settled as ``CLIENT_GONE`` (neutral) at the next choice.

``set_instances`` swaps the list atomically (reload, discovery); attempts out
on a removed instance still settle here. ``on_first_use`` runs once, at the
first choice (the pool starts its probes there when no lifespan ran).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Clock
from ballast_asgi.proxy.upstream import Upstream
from ballast_asgi.upstreams.core.instance import Instance, InstanceSpec, Lease
from ballast_asgi.upstreams.core.pool import Pool


class PoolSelector:
    """A ``Selector`` over a ``Pool``."""

    def __init__(
        self,
        pool: Pool,
        clock: Clock,
        *,
        max_lease_s: float = 60.0,
    ) -> None:
        self.pool = pool
        self.clock = clock
        self.max_lease_s = max_lease_s
        self.reaped = 0
        self._on_first_use: Callable[[], None] | None = None
        self._upstream: dict[Instance, Upstream] = {}
        self._instance: dict[Upstream, Instance] = {}
        self._open: dict[Instance, list[Lease]] = {}
        self._index()

    def _index(self) -> None:
        for inst in self.pool.instances:
            if inst not in self._upstream:
                up = Upstream.parse(inst.url)
                self._upstream[inst] = up
                self._instance[up] = inst
        live = set(self.pool.instances)
        for inst in [i for i in self._upstream if i not in live and not self._open.get(i)]:
            self._instance.pop(self._upstream.pop(inst), None)
            self._open.pop(inst, None)

    def on_first_use(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` once, at the next choice (inside the running loop)."""
        self._on_first_use = hook

    def set_instances(self, specs: Sequence[InstanceSpec]) -> None:
        """Replace the instance list (in-flight attempts on removed ones still settle)."""
        self.pool.set_instances(specs)
        self._index()

    def choose(self, ctx: Any, exclude: Collection[Upstream] = ()) -> Upstream:
        """Lease an instance for one attempt and return its upstream."""
        if self._on_first_use is not None:
            hook, self._on_first_use = self._on_first_use, None
            hook()
        now = self.clock()
        self._reap(now)
        keys = {self._instance[u].key for u in exclude if u in self._instance}
        lease = self.pool.choose(now, keys)
        self._open.setdefault(lease.instance, []).append(lease)
        return self._upstream[lease.instance]

    def report(
        self, upstream: Upstream, outcome: AttemptOutcome, rtt_s: float | None, now: float
    ) -> None:
        """Settle the attempt's lease with its outcome."""
        inst = self._instance.get(upstream)
        leases = self._open.get(inst) if inst is not None else None
        if not leases:
            return
        lease = _match(leases, rtt_s, now)
        self._settle(leases, lease, outcome, now)

    def report_body(self, upstream: Upstream, complete: bool, now: float) -> None:
        """A body cut mid-way counts against its instance (outlier detection)."""
        inst = self._instance.get(upstream)
        if inst is not None:
            self.pool.body_ended(inst, complete, now)

    def _settle(
        self, leases: list[Lease], lease: Lease, outcome: AttemptOutcome, now: float
    ) -> None:
        leases.remove(lease)
        self.pool.settle(lease, outcome, now)
        if lease.instance.removed and not leases:
            self._index()

    def _reap(self, now: float) -> None:
        limit = now - self.max_lease_s
        for leases in list(self._open.values()):
            while leases and leases[0].start < limit:
                self.reaped += 1
                self._settle(leases, leases[0], AttemptOutcome.CLIENT_GONE, now)

    def upstreams(self) -> Sequence[Upstream]:
        """The upstreams of the current instances."""
        return [self._upstream[i] for i in self.pool.instances]

    def open_leases(self) -> int:
        """Attempts chosen and not yet reported."""
        return sum(len(v) for v in self._open.values())


def _match(leases: list[Lease], rtt_s: float | None, now: float) -> Lease:
    if rtt_s is None:
        return leases[0]
    started = now - rtt_s
    return min(leases, key=lambda lease: abs(lease.start - started))
