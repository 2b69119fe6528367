"""The pool behind the proxy's selector seam: exclusion, lease matching, reaping, membership."""

from __future__ import annotations

import random

from ballast_asgi.core.breaker import Breaker
from ballast_asgi.core.limit import make_limit
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.proxy.upstream import Upstream
from ballast_asgi.upstreams.core.instance import InstanceSpec
from ballast_asgi.upstreams.core.outlier import OutlierPolicy
from ballast_asgi.upstreams.core.pool import Pool, PoolPolicy
from ballast_asgi.upstreams.selector import PoolSelector
from tests.fakes import FakeClock

URLS = ["http://a:1", "http://b:2", "http://c:3"]


def _selector(clock: FakeClock, urls: list[str] = URLS) -> PoolSelector:
    pool = Pool(
        [InstanceSpec(u) for u in urls],
        make_limiter=lambda: Limiter(make_limit("fixed", limit=50)),
        make_breaker=Breaker,
        rng=random.Random(5),
    )
    return PoolSelector(pool, clock, max_lease_s=10.0)


def test_choose_excludes_tried_upstreams() -> None:
    """An upstream already tried is not chosen again while others remain (nothing ejected)."""
    clock = FakeClock(0.0)
    pool = Pool(
        [InstanceSpec(u) for u in URLS],
        make_limiter=lambda: Limiter(make_limit("fixed", limit=50)),
        make_breaker=lambda: Breaker(enabled=False),
        policy=PoolPolicy(outlier=OutlierPolicy(enabled=False)),
        rng=random.Random(5),
    )
    sel = PoolSelector(pool, clock, max_lease_s=10.0)
    for _ in range(30):
        first = sel.choose(None)
        second = sel.choose(None, (first,))
        assert second != first
        sel.report(first, AttemptOutcome.CONNECT_ERROR, None, 0.0)
        sel.report(second, AttemptOutcome.SUCCESS, 0.0, 0.0)
    assert sel.open_leases() == 0


def test_report_settles_the_matching_lease() -> None:
    """Of two leases on one instance, the report's RTT picks the one that started then."""
    clock = FakeClock(0.0)
    sel = _selector(clock, URLS[:1] + URLS[1:2])
    up = Upstream.parse(URLS[0])
    early = sel.choose(None, (Upstream.parse(URLS[1]),))
    clock.now = 1.0
    late = sel.choose(None, (Upstream.parse(URLS[1]),))
    assert early == late == up
    sel.report(up, AttemptOutcome.SUCCESS, 0.25, 1.25)  # started at 1.0: the second lease
    inst = sel.pool.instances[0]
    assert inst.rtt_ewma_s == 0.25 and inst.outstanding == 1
    sel.report(up, AttemptOutcome.SUCCESS, 1.5, 1.5)
    assert inst.outstanding == 0 and inst.limiter.inflight == 0


def test_unreported_leases_are_reaped() -> None:
    """A lease never reported is settled as neutral after max_lease_s."""
    clock = FakeClock(0.0)
    sel = _selector(clock)
    sel.choose(None)
    clock.now = 11.0
    lease_up = sel.choose(None)
    assert sel.reaped == 1 and sel.open_leases() == 1
    sel.report(lease_up, AttemptOutcome.SUCCESS, 0.0, 11.0)
    assert all(i.limiter.inflight == 0 and i.failures == 0 for i in sel.pool.instances)


def test_first_use_hook_runs_once() -> None:
    """The hook (starting probes) runs at the first choice only."""
    calls: list[int] = []
    sel = _selector(FakeClock(0.0))
    sel.on_first_use(lambda: calls.append(1))
    for _ in range(3):
        sel.report(sel.choose(None), AttemptOutcome.SUCCESS, 0.0, 0.0)
    assert calls == [1]


def test_set_instances_keeps_removed_until_reported() -> None:
    """A removed instance's open lease still settles; then it is forgotten."""
    clock = FakeClock(0.0)
    sel = _selector(clock)
    up = sel.choose(None)
    keep = [u for u in URLS if Upstream.parse(u) != up]
    sel.set_instances([InstanceSpec(u) for u in keep])
    assert up not in sel.upstreams() and sel.open_leases() == 1
    sel.report(up, AttemptOutcome.SUCCESS, 0.0, 0.0)
    assert sel.open_leases() == 0 and sel.pool.draining == []
    assert [str(u) for u in sel.upstreams()] == keep
