"""Per-route baselines in the gradient controller (ADR 0016): fed samples, injected time."""

from __future__ import annotations

import random

import pytest

from ballast_asgi.core.limit import GradientLimit, Sample
from ballast_asgi.core.limit.route_floors import OTHER_ROUTE, RouteFloors

FAST, SLOW = 0.002, 1.0


def make(**kw: object) -> GradientLimit:
    params: dict[str, object] = {"initial_limit": 20, "min_limit": 4, "max_limit": 1000}
    params.update(kw)
    return GradientLimit(rng=random.Random(1), **params)  # type: ignore[arg-type]


def mixed(g: GradientLimit, seconds: float, *, slow_share: float, inflight: int = 10) -> list[int]:
    """Feed no-queue samples of a fast and a slow route (every 10 ms); the limits seen."""
    rng = random.Random(2)
    now, seen = 0.0, []
    while now < seconds:
        now += 0.01
        slow = rng.random() < slow_share
        rtt, route = (SLOW, "/delay") if slow else (FAST, "/get")
        g.on_sample(Sample(now - rtt, rtt, inflight, False, route=route), now)
        seen.append(g.limit)
    return seen


def test_mix_of_endpoints_is_not_read_as_queueing() -> None:
    """Fast and 500x slower samples, no queue: per-route floors hold the limit, one floor cuts."""
    one = make(route_baselines=False, quiet_limit=4)
    routes = make()
    assert min(mixed(one, 20.0, slow_share=0.6)) == 4
    assert min(mixed(routes, 20.0, slow_share=0.6)) == 20


def test_queueing_on_one_route_is_still_cut() -> None:
    """Samples of a route at 3x its own floor in binding windows bring the limit down."""
    g = make()
    now = 0.0
    for _ in range(200):  # the floor of /a: 20 ms at no load
        now += 0.005
        g.on_sample(Sample(now - 0.02, 0.02, 5, False, route="/a"), now)
    before = g.limit
    for _ in range(400):  # now it queues: 60 ms with every permit taken
        now += 0.005
        g.on_sample(Sample(now - 0.06, 0.06, g.limit, False, g.limit, route="/a"), now)
    assert g.limit < before / 2


def test_no_probe_dip_while_floors_are_remeasured() -> None:
    """Two minutes of mixed traffic: the floors refresh, the limit never drops to probe_limit."""
    g = make()
    seen = mixed(g, 120.0, slow_share=0.3, inflight=12)
    assert min(seen[300:]) == 20  # after the first window's probe: no pin to min_limit
    assert g.probes <= 1


def test_quiet_spell_keeps_the_initial_limit() -> None:
    """Windows with one request in flight do not shrink the limit below its initial value."""
    g = make(initial_limit=64)
    now = 0.0
    for _ in range(3000):
        now += 0.01
        g.on_sample(Sample(now - FAST, FAST, 1, False, route="/get"), now)
    assert g.limit == 64
    one = make(initial_limit=64, route_baselines=False, quiet_limit=4)
    now = 0.0
    for _ in range(3000):
        now += 0.01
        one.on_sample(Sample(now - FAST, FAST, 1, False, route="/get"), now)
    assert one.limit < 10  # the rule before ADR 0016: down to peak * 1.25 + sqrt(peak)


def test_floor_rises_from_calm_windows_after_a_refresh_period() -> None:
    """A route permanently 2x slower at low load gets the new floor within two refresh periods."""
    floors = RouteFloors(max_routes=8, refresh_s=5.0, percentile=0.5)
    now = 0.0
    for value in (0.01, 0.02):
        for _ in range(40):  # 40 windows of 0.5 s (20 s), none binding
            now += 0.5
            for _ in range(5):
                floors.record("/a", value)
            floors.close_window(binding=False, now=now)
    assert floors.floors["/a"] == pytest.approx(0.02)


def test_binding_windows_never_raise_a_floor() -> None:
    """Under sustained overload (every window binding) the floor stays where it was measured."""
    floors2 = RouteFloors(max_routes=8, refresh_s=1.0, percentile=0.5)
    for _ in range(5):
        floors2.record("/a", 0.01)
    floors2.close_window(binding=False, now=0.0)
    for i in range(100):
        for _ in range(5):
            floors2.record("/a", 0.05)
        floors2.close_window(binding=True, now=0.5 * (i + 1))
    assert floors2.floors["/a"] == pytest.approx(0.01)


def test_route_table_is_bounded() -> None:
    """Thousands of distinct routes keep at most max_routes floors; the rest share ~other."""
    g = make(max_routes=8)
    now = 0.0
    for i in range(5000):
        now += 0.001
        g.on_sample(Sample(now - 0.01, 0.01, 3, False, route=f"/r{i}"), now)
    routes = g.routes
    assert routes is not None
    assert len(routes.floors) <= 8
    assert OTHER_ROUTE in routes.floors


def test_probe_after_overload_does_not_raise_a_floor() -> None:
    """A probe that still finds the backend's backlog lowers floors but never raises them."""
    floors = RouteFloors(max_routes=8, refresh_s=30.0, percentile=0.5)
    for _ in range(5):
        floors.record("/a", 1.0)
    floors.close_window(binding=True, now=0.0)
    for _ in range(5):
        floors.record("/a", 3.0)
    floors.close_probe(moved=False)
    assert floors.floors["/a"] == pytest.approx(1.0)
    for _ in range(5):
        floors.record("/a", 3.0)
    floors.close_probe(moved=True)  # the stuck streak says the backend got slower
    assert floors.floors["/a"] == pytest.approx(3.0)


def test_snapshot_names_the_floors() -> None:
    """The snapshot lists each route's floor in milliseconds."""
    g = make()
    g.on_sample(Sample(0.0, 0.25, 1, False, route="/slow"), 0.25)
    snap = g.snapshot()
    baselines = snap["route_baselines"]
    assert isinstance(baselines, dict)
    assert baselines["floors_ms"] == {"/slow": 250.0}


def test_first_median_that_queued_does_not_replace_the_first_sample() -> None:
    """A route first seen under overload keeps its first sample's floor (median 1.9x above)."""
    floors = RouteFloors(max_routes=8, refresh_s=30.0, percentile=0.5)
    floors.relative("/slow", 1.0, True)
    for _ in range(5):
        floors.record("/slow", 1.92)
    floors.close_window(binding=False, now=1.0)
    assert floors.floors["/slow"] == pytest.approx(1.0)
    lucky = RouteFloors(max_routes=8, refresh_s=30.0, percentile=0.5)
    lucky.relative("/get", 0.001, True)
    for _ in range(5):
        lucky.record("/get", 0.0013)  # no-load spread: the median replaces the lucky sample
    lucky.close_window(binding=False, now=1.0)
    assert lucky.floors["/get"] == pytest.approx(0.0013)


def test_window_spans_two_round_trips_of_a_slow_route() -> None:
    """With a 1 s route a window does not close after 0.5 s: it waits two floors (2 s)."""
    g = make()
    now = 0.0
    for _ in range(6):  # 1 s requests completing every 0.1 s, nothing queued
        now += 0.1
        g.on_sample(Sample(now - SLOW, SLOW, 5, False, route="/delay"), now)
    assert g.windows == 0
    while now < 2.5:
        now += 0.1
        g.on_sample(Sample(now - SLOW, SLOW, 5, False, route="/delay"), now)
    assert g.windows == 1
