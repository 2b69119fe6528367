"""The limiter partitioned by route (ADR 0016): permits, dispatch, quiet and idle routes."""

from __future__ import annotations

from ballast_asgi.core.limit import LimitAlgorithm, Sample, make_limit
from ballast_asgi.core.limiter import QUIET_AFTER_S, Limiter
from ballast_asgi.core.outcome import Outcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.queue import PriorityQueue, Waiter, dispatch


def factory(cold: int = 2, quiet: int = 6) -> object:
    def build(is_quiet: bool) -> LimitAlgorithm:
        return make_limit("fixed", limit=quiet if is_quiet else cold)

    return build


def parted(**kw: object) -> Limiter:
    return Limiter(make_limit("fixed", limit=2), partition=factory(), **kw)  # type: ignore[arg-type]


def test_a_full_route_does_not_block_another() -> None:
    """Route /slow at its limit refuses; /fast still gets permits of its own."""
    lim = parted()
    slow = [lim.try_acquire(0.0, "/slow") for _ in range(3)]
    assert slow[2] is None
    fast = lim.try_acquire(0.0, "/fast")
    assert fast is not None and fast.route == "/fast"
    for p in (*slow[:2], fast):
        assert p is not None
        p.release(Outcome.SUCCESS, 0.1)
    assert lim.inflight == 0


def test_dispatch_skips_waiters_of_a_full_route() -> None:
    """A queued /slow waiter stays while its route is full; the /fast one behind it is granted."""
    lim = parted()
    held = [lim.try_acquire(0.0, "/slow") for _ in range(2)]
    q = PriorityQueue()
    w_slow = Waiter(Priority.CRITICAL, 0.0, route="/slow")
    w_fast = Waiter(Priority.BULK, 0.0, route="/fast")
    q.push(w_slow)
    q.push(w_fast)
    got: list[Waiter] = []
    assert dispatch(q, lim, 0.0, lambda w, p: got.append(w) or True) == 1
    assert got == [w_fast] and q.total == 1
    first = held[0]
    assert first is not None
    first.release(Outcome.SUCCESS, 0.2)
    assert dispatch(q, lim, 0.2, lambda w, p: got.append(w) or True) == 1
    assert got == [w_fast, w_slow] and q.total == 0


def test_dispatch_hands_back_a_permit_nobody_takes() -> None:
    """A waiter gone at the instant of its grant returns the permit: nothing leaks."""
    lim = parted()
    q = PriorityQueue()
    q.push(Waiter(Priority.STANDARD, 0.0, route="/a"))
    assert dispatch(q, lim, 0.0, lambda w, p: False) == 0
    assert lim.inflight == 0


def test_new_route_starts_at_the_quiet_limit_only_when_quiet() -> None:
    """Cold start: the initial limit; answering for a while with no route full: the quiet one."""
    lim = parted()
    cold = lim.try_acquire(0.0, "/a")
    assert cold is not None and cold.limit_at_start == 2
    cold.release(Outcome.SUCCESS, 0.01)
    now = 0.01 + QUIET_AFTER_S
    quiet = lim.try_acquire(now, "/b")
    assert quiet is not None and quiet.limit_at_start == 6


def test_no_quiet_start_while_a_route_is_at_its_limit() -> None:
    """A new route seen while another is saturated starts at the cold initial limit."""
    lim = parted()
    first = lim.try_acquire(0.0, "/a")
    assert first is not None
    first.release(Outcome.SUCCESS, 0.01)
    now = 2.0
    held = [lim.try_acquire(now, "/a") for _ in range(2)]
    assert all(held)
    other = lim.try_acquire(now, "/b")
    assert other is not None and other.limit_at_start == 2


def test_idle_route_starts_over() -> None:
    """A route unused for partition_idle_s gets a fresh partition (the quiet limit)."""
    lim = parted(partition_idle_s=5.0)
    p = lim.try_acquire(0.0, "/a")
    assert p is not None and p.limit_at_start == 2
    p.release(Outcome.SUCCESS, 0.01)
    again = lim.try_acquire(10.0, "/a")
    assert again is not None and again.limit_at_start == 6


def test_partitions_are_bounded() -> None:
    """Thousands of routes make at most max_partitions partitions; the rest share ~other."""
    lim = Limiter(make_limit("fixed", limit=2), partition=factory(100, 100), max_partitions=4)
    for i in range(1000):
        p = lim.try_acquire(0.0, f"/r{i}")
        assert p is not None
        p.release(Outcome.SUCCESS, 0.001)
    snap = lim.snapshot()
    parts = snap["partitions"]
    assert isinstance(parts, dict) and len(parts) == 4 and "~other" in parts


def test_each_route_samples_its_own_algorithm() -> None:
    """A gradient per route: slow samples of /slow never cut the limit of /fast."""

    def build(quiet: bool) -> LimitAlgorithm:
        return make_limit("gradient", initial_limit=20, min_limit=4, max_limit=200)

    lim = Limiter(make_limit("fixed", limit=1), partition=build)
    now = 0.0
    for _ in range(2000):
        now += 0.005
        fast = lim.try_acquire(now - 0.002, "/fast")
        assert fast is not None
        fast.release(Outcome.SUCCESS, now)
        slow = lim.try_acquire(now - 1.0, "/slow")
        if slow is not None:
            slow.release(Outcome.SUCCESS, now, rtt_s=1.0 + (now % 3.0))
    parts = lim.snapshot()["partitions"]
    assert isinstance(parts, dict)
    assert parts["/fast"]["limit"] == 20


def test_unpartitioned_limiter_keeps_the_route_on_its_samples() -> None:
    """Without partitions the one algorithm sees each sample's route key."""
    seen: list[Sample] = []

    class Spy:
        name = "spy"
        limit = 5

        def on_sample(self, sample: Sample, now: float) -> int:
            seen.append(sample)
            return 5

        def snapshot(self) -> dict[str, object]:
            return {"name": "spy"}

    lim = Limiter(Spy())
    p = lim.try_acquire(0.0, "/x")
    assert p is not None
    p.release(Outcome.SUCCESS, 0.1)
    assert seen[0].route == "/x"


def test_reconfigure_drops_partitions_without_leaking() -> None:
    """set_algorithm without partitions: permits taken before release cleanly, inflight 0."""
    lim = parted()
    p = lim.try_acquire(0.0, "/a")
    assert p is not None
    lim.set_algorithm(make_limit("fixed", limit=3))
    assert not lim.partitioned
    p.release(Outcome.SUCCESS, 0.1)
    assert lim.inflight == 0


def test_config_keys_are_validated_by_name() -> None:
    """limiter.max_routes, quiet_limit and partition_by_route reject bad values naming the key."""
    import pytest
    from pydantic import ValidationError

    from ballast_asgi.config import GatewayConfig

    for limiter, key in (
        ({"max_routes": 1}, "max_routes"),
        ({"max_routes": 5000}, "max_routes"),
        ({"quiet_limit": 0}, "quiet_limit"),
        ({"partition_by_route": "maybe"}, "partition_by_route"),
        ({"gradient": {"route_baselines": "sometimes"}}, "route_baselines"),
    ):
        with pytest.raises(ValidationError, match=key):
            GatewayConfig.model_validate({"limiter": limiter})


def test_the_gateway_stack_is_partitioned_by_default_but_not_when_fixed() -> None:
    """Default: a partitioned gradient; fixed, or partition_by_route off: one limit."""
    import random

    from ballast_asgi.config import GatewayConfig
    from ballast_asgi.gateway.stack import make_partition

    rng = random.Random(1)
    build = make_partition(GatewayConfig(), rng)
    assert build is not None
    assert build(True).limit == 64 and build(False).limit == 20
    fixed = GatewayConfig.model_validate({"limiter": {"algorithm": "fixed"}})
    assert make_partition(fixed, rng) is None
    off = GatewayConfig.model_validate({"limiter": {"partition_by_route": False}})
    assert make_partition(off, rng) is None


def test_dispatch_does_not_scan_when_every_queued_route_is_full() -> None:
    """With 500 waiters of a full route, dispatch asks about routes, never about waiters."""
    lim = parted()
    held = [lim.try_acquire(0.0, "/fast") for _ in range(2)]
    q = PriorityQueue()
    for _ in range(500):
        q.push(Waiter(Priority.BULK, 0.0, route="/fast"))
    calls = 0
    real = q.pop_best

    def counting(fits: object = None) -> Waiter | None:
        nonlocal calls
        calls += 1
        return real(fits)  # type: ignore[arg-type]

    q.pop_best = counting  # type: ignore[method-assign]
    assert dispatch(q, lim, 0.0, lambda w, p: True) == 0
    assert calls == 0 and q.queued_routes() == ["/fast"]
    first = held[0]
    assert first is not None
    first.release(Outcome.SUCCESS, 0.1)
    assert dispatch(q, lim, 0.1, lambda w, p: True) == 1 and calls == 1
    assert q.total == 499


def test_route_counts_follow_every_way_out_of_the_queue() -> None:
    """Pop, remove, displacement and expiry keep the per-route counts exact."""
    q = PriorityQueue(max_size=4, per_priority=False)
    a = Waiter(Priority.BULK, 0.0, deadline=1.0, route="/a")
    b = Waiter(Priority.BULK, 0.0, route="/b")
    c = Waiter(Priority.STANDARD, 0.0, route="/c")
    for w in (a, b, c, Waiter(Priority.BULK, 0.0, route="/a")):
        assert q.push(w).accepted
    pushed = q.push(Waiter(Priority.CRITICAL, 0.0, route="/d"))  # displaces the oldest bulk: a
    assert pushed.displaced is a
    assert sorted(q.queued_routes()) == ["/a", "/b", "/c", "/d"]
    assert q.remove(b) and "/b" not in q.queued_routes()
    assert q.pop_best() is not None  # the critical /d
    assert "/d" not in q.queued_routes()
    q.expire(5.0)
    assert sorted(q.queued_routes()) == ["/a", "/c"] and q.total == 2


def test_only_routes_that_ask_get_their_own_limit_when_not_partitioning_all() -> None:
    """own_routes: /slow has its own partition; /a and /b share one (the shared key)."""
    lim = Limiter(
        make_limit("fixed", limit=2), partition=factory(), own_routes=frozenset({"/slow"})
    )
    a = lim.try_acquire(0.0, "/a")
    b = lim.try_acquire(0.0, "/b")
    assert a is not None and b is not None
    assert lim.try_acquire(0.0, "/c") is None  # /a, /b, /c share two permits
    slow = lim.try_acquire(0.0, "/slow")
    assert slow is not None and slow.part is not a.part
    assert a.route == "/a" and b.part is a.part  # samples keep their route for the floors
    parts = lim.snapshot()["partitions"]
    assert isinstance(parts, dict) and sorted(parts) == ["", "/slow"]


def test_config_partition_flag_on_a_route_partitions_only_it() -> None:
    """partition_by_route false + routes[].limiter.partition: a partitioned limiter for it."""
    import random

    from ballast_asgi.config import GatewayConfig
    from ballast_asgi.gateway.stack import make_partition, own_routes

    cfg = GatewayConfig.model_validate(
        {
            "limiter": {"partition_by_route": False},
            "routes": [{"name": "slow", "path": "/delay/*", "limiter": {"partition": True}}],
        }
    )
    assert own_routes(cfg) == frozenset({"slow"})
    assert make_partition(cfg, random.Random(1)) is not None
    assert own_routes(GatewayConfig()) is None


def test_a_full_table_makes_room_by_dropping_idle_partitions() -> None:
    """Partitions unused for partition_idle_s leave a full table; a new route gets its own."""
    lim = Limiter(
        make_limit("fixed", limit=2), partition=factory(), max_partitions=4, partition_idle_s=5.0
    )
    for i in range(3):
        p = lim.try_acquire(0.0, f"/r{i}")
        assert p is not None
        p.release(Outcome.SUCCESS, 0.01)
    fresh = lim.try_acquire(10.0, "/new")
    assert fresh is not None and fresh.route == "/new"


def test_overflow_route_is_keyed_by_first_segment() -> None:
    """A request in the route table's overflow group (not yet learned) keys its own segment."""
    from ballast_asgi.core.routes import Route
    from ballast_asgi.middleware.context import RequestContext
    from ballast_asgi.middleware.limit_route import limit_route

    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    ctx.route = Route("other", source="overflow")
    assert limit_route({"path": "/delay/1"}, ctx) == "/delay"
    ctx.route = Route("/get", source="auto")
    assert limit_route({"path": "/get/x"}, ctx) == "/get"
