"""The pool core: eligibility, panic mode, exclusion, per-instance limits and breakers, reload."""

from __future__ import annotations

import random
from collections import Counter

from ballast_asgi.core.breaker import Breaker
from ballast_asgi.core.limit import make_limit
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.upstreams.core.health import HealthPolicy
from ballast_asgi.upstreams.core.instance import InstanceSpec, display_url
from ballast_asgi.upstreams.core.limit import PoolLimit
from ballast_asgi.upstreams.core.outlier import OutlierPolicy
from ballast_asgi.upstreams.core.pool import Pool, PoolPolicy, is_gateway_failure

URLS = ["http://a:1", "http://b:2", "http://c:3"]
OK = AttemptOutcome.SUCCESS


def make_pool(urls: list[str] = URLS, limit: int = 100, **policy: object) -> Pool:
    return Pool(
        [InstanceSpec(u) for u in urls],
        make_limiter=lambda: Limiter(make_limit("fixed", limit=limit)),
        make_breaker=lambda: Breaker(min_failing_clients=1, consecutive_failures=10),
        policy=PoolPolicy(**policy),  # type: ignore[arg-type]
        rng=random.Random(11),
    )


def test_spreads_and_settles() -> None:
    """Sequential attempts spread over all instances; settling frees every permit."""
    pool = make_pool()
    counts: Counter[str] = Counter()
    for i in range(300):
        lease = pool.choose(float(i))
        counts[lease.instance.key] += 1
        pool.settle(lease, OK, float(i) + 0.01)
    assert set(counts) == set(URLS) and min(counts.values()) > 70
    assert all(inst.outstanding == 0 and inst.limiter.inflight == 0 for inst in pool.instances)


def test_exclude_picks_another_instance() -> None:
    """A retry that excludes the tried instance lands elsewhere."""
    pool = make_pool()
    for _ in range(50):
        first = pool.choose(0.0)
        second = pool.choose(0.0, exclude={first.instance.key})
        assert second.instance is not first.instance
        pool.settle(first, OK, 0.1)
        pool.settle(second, OK, 0.1)


def test_exclude_everything_falls_back() -> None:
    """When every instance was tried, the pick still returns one."""
    pool = make_pool(urls=URLS[:1])
    lease = pool.choose(0.0, exclude={URLS[0]})
    assert lease.instance.url == URLS[0]
    pool.settle(lease, OK, 0.0)


def _fail(pool: Pool, key: str, n: int, now: float, outcome: AttemptOutcome) -> None:
    inst = next(i for i in pool.instances if i.key == key)
    for _ in range(n):
        lease = pool.choose(now, exclude={k.key for k in pool.instances if k is not inst})
        assert lease.instance is inst
        pool.settle(lease, outcome, now)


def test_connect_errors_eject_and_route_around() -> None:
    """Five connect errors eject an instance; it gets nothing until the ejection ends."""
    pool = make_pool()
    _fail(pool, URLS[0], 5, 1.0, AttemptOutcome.CONNECT_ERROR)
    picks = set()
    for _ in range(100):
        lease = pool.choose(1.5)
        picks.add(lease.instance.key)
        pool.settle(lease, OK, 1.5)
    assert URLS[0] not in picks
    snap = {d["url"]: d for d in pool.snapshot(1.5)}
    assert snap[URLS[0]]["ejected"] and snap[URLS[0]]["ejected_until_s"] == 4.5


def test_bodies_cut_after_good_heads_eject_and_whole_bodies_reset_the_count() -> None:
    """Resets mid-response count although every head was fine; a whole body resets the run."""
    pool = make_pool()
    inst = pool.instances[0]
    for complete in (False, False, False, False, True):  # four cuts, then a whole body
        pool.body_ended(inst, complete, 1.0)
    assert inst.outlier.body_consecutive == 0 and inst.routable(1.0)
    assert inst.outlier.counts(1.0) == (0, 4)  # failures amend calls counted at their heads
    for _ in range(5):
        pool.body_ended(inst, False, 1.1)
    assert not inst.routable(1.1) and inst.outlier.ejections == 1 and inst.failures == 9


def test_deadline_is_neutral() -> None:
    """The client's own deadline running out never ejects and never trips the breaker."""
    pool = make_pool()
    _fail(pool, URLS[0], 50, 1.0, AttemptOutcome.DEADLINE)
    inst = pool.instances[0]
    assert inst.routable(1.0) and inst.failures == 0 and inst.outlier.ejections == 0


def test_gateway_failure_classes() -> None:
    """502/503/504, connect, reset and timeout feed the consecutive rule; a 500 does not."""
    assert is_gateway_failure(AttemptOutcome.STATUS_5XX, 503)
    assert not is_gateway_failure(AttemptOutcome.STATUS_5XX, 500)
    assert is_gateway_failure(AttemptOutcome.PROTOCOL_ERROR, None)
    assert not is_gateway_failure(AttemptOutcome.DEADLINE, None)


def test_panic_mode_uses_every_instance() -> None:
    """When too few instances are healthy, all of them are eligible again."""
    pool = make_pool(health=HealthPolicy(unhealthy_threshold=1))
    for inst in pool.instances[:2]:
        pool.record_probe(inst, False, "refused")
    eligible, panic = pool.eligible(0.0)
    assert panic and len(eligible) == 3
    pool.record_probe(pool.instances[1], True)
    pool.record_probe(pool.instances[1], True)
    eligible, panic = pool.eligible(0.0)
    assert not panic and [i.key for i in eligible] == URLS[1:]


def test_probe_failure_takes_instance_out() -> None:
    """An instance failing its probes leaves the rotation and returns after passing again."""
    pool = make_pool(health=HealthPolicy(unhealthy_threshold=2, healthy_threshold=2))
    c = pool.instances[2]
    assert not pool.record_probe(c, False, "timeout")
    assert pool.record_probe(c, False, "timeout")
    assert c not in pool.eligible(0.0)[0]
    pool.record_probe(c, True)
    assert pool.record_probe(c, True)
    assert c in pool.eligible(0.0)[0]


def test_per_instance_limit_prefers_room_then_overflows() -> None:
    """An instance at its own limit is skipped; when all are full the pick overflows."""
    pool = make_pool(limit=1)
    leases = [pool.choose(0.0) for _ in range(3)]
    assert {lease.instance.key for lease in leases} == set(URLS)
    extra = pool.choose(0.0)
    assert extra.permit is None and pool.overflows == 1
    for lease in [*leases, extra]:
        pool.settle(lease, OK, 0.1)
    assert all(i.limiter.inflight == 0 for i in pool.instances)


def test_open_instance_breaker_routes_around() -> None:
    """An instance whose own breaker opened is out of the rotation."""
    pool = Pool(
        [InstanceSpec(u) for u in URLS],
        make_limiter=lambda: Limiter(make_limit("fixed", limit=10)),
        make_breaker=lambda: Breaker(min_failing_clients=1, consecutive_failures=2),
        policy=PoolPolicy(outlier=OutlierPolicy(enabled=False)),
        rng=random.Random(1),
    )
    _fail(pool, URLS[1], 2, 0.0, AttemptOutcome.STATUS_5XX)
    assert pool.instances[1].breaker.state(0.0).value == "open"
    assert pool.instances[1] not in pool.eligible(0.0)[0]


def test_reload_keeps_state_and_drains_removed() -> None:
    """set_instances keeps kept URLs' state; a removed one finishes its attempts."""
    pool = make_pool()
    b = pool.instances[1]
    held = pool.choose(0.0, exclude={URLS[0], URLS[2]})
    assert held.instance is b
    pool.set_instances([InstanceSpec(URLS[0], 2.0), InstanceSpec("http://d:4")])
    assert [i.key for i in pool.instances] == [URLS[0], "http://d:4"]
    assert pool.instances[0].weight == 2.0 and b.removed and pool.draining == [b]
    others = [pool.choose(0.1) for _ in range(20)]
    assert all(lease.instance is not b for lease in others)
    for lease in others:
        pool.settle(lease, OK, 0.1)
    pool.settle(held, OK, 0.2)
    assert pool.draining == [] and b.limiter.inflight == 0


def test_settle_twice_is_ignored() -> None:
    """A second settle of the same lease changes nothing."""
    pool = make_pool()
    lease = pool.choose(0.0)
    pool.settle(lease, OK, 0.1)
    pool.settle(lease, AttemptOutcome.CONNECT_ERROR, 0.1)
    assert lease.instance.outstanding == 0 and lease.instance.failures == 0


def test_round_robin_policy() -> None:
    """The round-robin balancer cycles through the instances."""
    pool = make_pool(balancer="round_robin")
    keys = []
    for _ in range(6):
        lease = pool.choose(0.0)
        keys.append(lease.instance.key)
        pool.settle(lease, OK, 0.0)
    assert keys == URLS + URLS


def test_pool_limit_is_sum_of_eligible() -> None:
    """The gateway-wide limit is the sum of the routable instances' limits."""
    pool = make_pool(limit=7)
    now = [1.0]
    algo = PoolLimit(pool, clock=lambda: now[0], cap=100)
    assert algo.limit == 21
    _fail(pool, URLS[0], 5, 1.0, AttemptOutcome.CONNECT_ERROR)
    assert algo.limit == 14
    assert PoolLimit(pool, clock=lambda: 1.0, cap=10).limit == 10


def test_display_url_hides_userinfo() -> None:
    """Snapshots never show credentials in an instance URL."""
    assert display_url("http://user:pw@h:81/base") == "http://h:81/base"
    assert display_url("http://[::1]:9/") == "http://[::1]:9/"


def _notes() -> tuple[list[tuple[str, str, dict[str, object]]], object]:
    seen: list[tuple[str, str, dict[str, object]]] = []

    def notify(event: str, level: str, **fields: object) -> None:
        seen.append((event, level, fields))

    return seen, notify


def test_panic_never_chooses_an_ejected_instance() -> None:
    """Every instance failing its probes (panic): an ejected one still gets no attempt."""
    pool = make_pool(health=HealthPolicy(unhealthy_threshold=1))
    for inst in pool.instances:
        pool.record_probe(inst, False, "status 404")
    bad = pool.instances[0]
    for i in range(5):
        lease = pool.choose(0.0, exclude={URLS[1], URLS[2]})
        pool.settle(lease, AttemptOutcome.CONNECT_ERROR, 0.01 * i)
    assert bad.outlier.ejected(0.1)
    chosen = Counter(pool.choose(0.1, exclude={URLS[1]}).instance.key for _ in range(100))
    assert pool.eligible(0.1)[1] and URLS[0] not in chosen


def test_state_changes_are_notified_once() -> None:
    """Ejected/restored, unhealthy/healthy, all failing and panic enter/leave: one note each."""
    seen, notify = _notes()
    pool = make_pool(health=HealthPolicy(unhealthy_threshold=1, healthy_threshold=1))
    pool.notify = notify  # type: ignore[assignment]
    for inst in pool.instances:
        pool.record_probe(inst, False, "status 500")
    pool.eligible(0.0)
    pool.eligible(0.1)
    for inst in pool.instances:
        pool.record_probe(inst, True)
    pool.eligible(0.2)
    for _ in range(5):
        lease = pool.choose(1.0, exclude={URLS[1], URLS[2]})
        pool.settle(lease, AttemptOutcome.CONNECT_ERROR, 1.0)
    pool.eligible(3.0)
    pool.eligible(7.0)
    names = [e for e, _, _ in seen]
    assert names == ["pool.instance_unhealthy"] * 3 + ["pool.all_failing_probes",
                     "pool.panic_enter", "pool.instance_healthy", "pool.probes_recovered",
                     "pool.instance_healthy", "pool.instance_healthy", "pool.panic_leave",
                     "pool.instance_ejected", "pool.instance_restored"]  # fmt: skip
    ejected = seen[-2][2]
    assert ejected["instance"] == URLS[0] and ejected["rule"] == "consecutive"
    assert ejected["ejection_s"] == 5.0 and seen[-2][1] == "warning"


def test_warnings_say_when_every_probe_fails() -> None:
    """The snapshot's pool warnings name the probe path when every instance fails it."""
    pool = make_pool(health=HealthPolicy(unhealthy_threshold=1, expect="2xx"))
    assert pool.warnings() == []
    for inst in pool.instances:
        pool.record_probe(inst, False, "status 404")
    (warning,) = pool.warnings()
    assert "GET /health" in warning and "expect 2xx" in warning
