"""The gradient controller: windows, growth, backoff, probes (fed samples, no clock).

These rules are checked with one floor for every sample (``route_baselines``
off, the rule before ADR 0016); every sample here has the same route, where
the per-route floors read the same. ``tests/core/test_route_floors.py`` checks the
per-route floors.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast_asgi.core.limit import GradientLimit, Sample

WINDOW_S = 0.5


def make(**kw: object) -> GradientLimit:
    params: dict[str, object] = {
        "initial_limit": 20,
        "min_limit": 4,
        "max_limit": 1000,
        "route_baselines": False,
        "quiet_limit": 4,
    }
    params.update(kw)
    return GradientLimit(rng=random.Random(1), **params)  # type: ignore[arg-type]


def feed_window(
    g: GradientLimit, now: float, rtt: float, *, inflight: int | None = None, n: int = 20
) -> float:
    """Feed samples ``WINDOW_S / n`` apart until a window closes (or a probe ends)."""
    windows, probes = g.windows, g.probes
    for _ in range(50 * n):
        now += WINDOW_S / n
        held = g.limit if inflight is None else inflight
        g.on_sample(Sample(now - rtt, rtt, held, False), now)
        if g.windows != windows or g.probes != probes:
            return now
    raise AssertionError("no window closed")


def settle(g: GradientLimit, now: float, rtt: float) -> float:
    """Run windows at ``rtt`` until the first probe has finished."""
    for _ in range(10):
        now = feed_window(g, now, rtt)
        if g.probes and not g.probing:
            return now
    raise AssertionError("the first probe never finished")


def simulate(
    g: GradientLimit, now: float, workers: int, windows: int, service_s: float = 0.025
) -> tuple[float, list[int]]:
    """Saturating demand on ``workers`` servers: RTT grows once the limit exceeds them.

    Returns the new time and the limit at the end of each window.
    """
    limits = []
    for _ in range(windows):
        end = now + WINDOW_S
        while now < end:
            held = g.limit
            rtt = service_s * max(1.0, held / workers)
            now += service_s / min(held, workers)
            g.on_sample(Sample(now - rtt, rtt, held, False), now)
        limits.append(g.limit)
    return now, limits


def test_no_update_before_the_window_closes() -> None:
    """Samples inside one window do not move the limit."""
    g = make()
    for i in range(10):
        g.on_sample(Sample(0.0, 0.02, 20, False), 0.01 * i)
    assert g.limit == 20
    assert g.rtt_recent_s is None


def test_first_window_starts_a_probe_pinned_at_probe_limit() -> None:
    """After the first window the no-load RTT is re-measured at probe_limit."""
    g = make()
    feed_window(g, 0.0, 0.05)
    assert g.probing
    assert g.limit == 4


def test_first_binding_window_holds_the_limit_until_the_floor_is_probed() -> None:
    """The first window has no floor to judge by (ratio 1): it neither grows nor cuts."""
    g = make()
    now = feed_window(g, 0.0, 0.075)
    assert g.probing
    for i in range(10):  # the probe: an idle backend answers at 25 ms
        t = now + 0.03 + 0.01 * i
        g.on_sample(Sample(t - 0.025, 0.025, 4, False), t)
    assert not g.probing
    assert g.limit == 20  # not 30: the binding first window did not multiply by 1.5


def test_probe_counts_only_requests_started_during_it() -> None:
    """Samples of requests started before the probe do not set the no-load RTT."""
    g = make(probe_samples=3)
    now = feed_window(g, 0.0, 0.08)
    assert g.probing
    for i in range(5):  # old requests, still slow
        g.on_sample(Sample(0.0, 0.08, 20, False), now + 0.001 * i)
    assert g.probing
    for i in range(3):
        t = now + 0.1 + 0.01 * i
        g.on_sample(Sample(t - 0.02, 0.02, 4, False), t)
    assert not g.probing
    assert g.rtt_noload_s == pytest.approx(0.02)
    assert g.limit == 20  # restored: the first window holds the limit (no floor yet)


def test_grows_multiplicatively_when_binding_at_the_floor() -> None:
    """Without slow start, binding at the no-load RTT multiplies the limit each window."""
    g = make(slow_start_tolerance=0)
    now = settle(g, 0.0, 0.025)
    before = g.limit
    feed_window(g, now, 0.025)
    assert g.limit == int(before * 1.5)


def test_backs_off_quickly_when_latency_rises() -> None:
    """Latency 3x the floor cuts the limit to about half plus headroom in one window."""
    g = make()
    now = settle(g, 0.0, 0.025)
    limit = g.limit
    feed_window(g, now, 0.075)
    assert g.limit <= int(limit * 0.5 + limit**0.5) + 1


def test_no_growth_when_not_binding() -> None:
    """Light traffic (in-flight far below the limit) never raises the limit."""
    g = make()
    now = settle(g, 0.0, 0.025)
    limit = g.limit
    for _ in range(20):
        now = feed_window(g, now, 0.025, inflight=2)
    assert g.limit <= limit


def test_no_drift_while_the_upstream_hangs() -> None:
    """A long silence, then one slow sample, does not raise the limit."""
    g = make()
    now = settle(g, 0.0, 0.025)
    limit = g.limit
    g.on_sample(Sample(now, 30.0, limit, False), now + 30.0)
    assert g.limit <= limit


def test_drop_backs_off_at_most_once_per_window() -> None:
    """Dropped samples cut the limit by backoff_ratio once per window of time."""
    g = make()
    now = settle(g, 0.0, 0.025)
    limit = g.limit
    for i in range(10):
        g.on_sample(Sample(now, 1.0, limit, True), now + 0.01 * i)
    assert g.limit == int(limit * 0.9)
    g.on_sample(Sample(now, 1.0, limit, True), now + WINDOW_S + 0.2)
    assert g.limit == int(limit * 0.9 * 0.9)


def test_window_with_a_drop_does_not_grow() -> None:
    """A window that saw a drop cannot raise the limit even at the floor."""
    g = make()
    now = settle(g, 0.0, 0.025)
    g.on_sample(Sample(now, 1.0, g.limit, True), now + 0.001)
    after_drop = g.limit
    feed_window(g, now, 0.025)
    assert g.limit <= after_drop


def test_noload_rises_again_when_the_backend_slows() -> None:
    """After the backend gets 5x slower, a probe lifts the no-load RTT and the limit recovers."""
    g = make()
    now, _ = simulate(g, 0.0, workers=8, windows=20)
    assert g.rtt_noload_s == pytest.approx(0.025)
    now, limits = simulate(g, now, workers=8, windows=30, service_s=0.125)
    assert g.rtt_noload_s == pytest.approx(0.125)
    assert limits[-1] >= 8


def test_converges_near_the_knee() -> None:
    """Against 8 saturated workers the limit settles just above 8, not at max."""
    g = make(initial_limit=100)
    _, limits = simulate(g, 0.0, workers=8, windows=40)
    assert all(8 <= lim <= 16 for lim in limits[-10:])


def test_binding_tolerance_queues_less_at_the_backend_than_1_5() -> None:
    """At 8 saturated workers (binding) the default 1.25 settles at 13-14 in flight, 1.5 at 16."""
    settled = {}
    for q in (1.25, 1.5):
        g = make(queue_tolerance_binding=q)
        _, limits = simulate(g, 0.0, workers=8, windows=40)
        settled[q] = limits[-10:]
    assert (make().queue_tolerance, make().queue_tolerance_binding) == (1.5, 1.25)
    assert all(12 <= lim <= 14 for lim in settled[1.25])
    assert all(lim == 16 for lim in settled[1.5])


def test_a_window_that_did_not_bind_cuts_with_the_looser_tolerance() -> None:
    """RTT 2x the floor: a binding window keeps 1.25 * 0.5 of the limit, one below it 1.5 * 0.5."""
    cut = {}
    for inflight in (None, 12):  # at the limit (20) / below it (but above half)
        g = make(shrink_headroom=0)
        now = settle(g, 0.0, 0.025)
        assert g.limit == 20
        feed_window(g, now, 0.05, inflight=inflight)
        cut[inflight] = g.limit
    assert cut[None] == int(20 * 1.25 * 0.5 + 20**0.5)  # 16
    assert cut[12] == int(20 * 1.5 * 0.5 + 20**0.5)  # 19


def test_finds_a_capacity_step_within_a_few_windows() -> None:
    """When workers go 8 -> 64 the limit passes 64 in under ten windows (5 s)."""
    g = make()
    now, _ = simulate(g, 0.0, workers=8, windows=20)
    _, limits = simulate(g, now, workers=64, windows=10)
    assert max(limits) >= 64


def test_capacity_drop_brings_the_limit_down() -> None:
    """When workers go 64 -> 8 the limit falls back near the knee."""
    g = make()
    now, _ = simulate(g, 0.0, workers=64, windows=30)
    _, limits = simulate(g, now, workers=8, windows=20)
    assert limits[-1] <= 16


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"window_ms": 0}, "window_ms"),
        ({"rtt_percentile": 1.5}, "rtt_percentile"),
        ({"tolerance": 0.9}, "tolerance"),
        ({"growth_factor": 0.5}, "growth_factor"),
        ({"backoff_ratio": 1.0}, "backoff_ratio"),
        ({"min_limit": 30}, "initial_limit"),
    ],
)
def test_rejects_bad_parameters(kw: dict[str, object], field: str) -> None:
    """Invalid parameters raise ValueError naming the parameter."""
    with pytest.raises(ValueError, match=field):
        make(**kw)


def test_slow_start_grows_within_a_window() -> None:
    """Successes at the limit and at the floor raise the limit at once, one step each."""
    g = make()
    now = settle(g, 0.0, 0.025) + 0.05  # samples started after the probe ended
    before, windows = g.limit, g.windows
    for i in range(6):
        now += 0.001
        g.on_sample(Sample(now - 0.025, 0.025, g.limit, False, g.limit), now)
        assert g.limit == int(before + (i + 1) * g.slow_start_step)
    assert g.limit == before + 3
    assert g.windows == windows


def test_slow_start_grows_one_and_a_half_times_per_round_trip_at_most() -> None:
    """A request started at limit L counts as binding against L, not the limit since grown:
    one round trip of L requests adds at most L * slow_start_step (0.5)."""
    g = make()
    now = settle(g, 0.0, 0.025) + 0.05
    start = g.limit
    for _ in range(start):  # one round trip: the requests that started at the old limit
        now += 0.0005
        g.on_sample(Sample(now - 0.025, 0.025, start, False, start), now)
    assert g.limit == int(1.5 * start)
    for _ in range(3 * start):  # more of them never pass twice the limit they started at
        now += 0.0005
        g.on_sample(Sample(now - 0.025, 0.025, start, False, start), now)
    assert g.limit <= 2 * start + 1


def test_slow_start_step_one_doubles_per_round_trip() -> None:
    """slow_start_step=1 (the ADR 0008 rule) lets one round trip double the limit."""
    g = make(slow_start_step=1.0)
    now = settle(g, 0.0, 0.025) + 0.05
    start = g.limit
    for _ in range(start):
        now += 0.0005
        g.on_sample(Sample(now - 0.025, 0.025, g.limit, False, g.limit), now)
    assert g.limit == 2 * start


def test_slow_start_needs_latency_at_the_floor() -> None:
    """Successes at the limit that queued (1.5x the floor) do not grow it within the window."""
    g = make()
    now = settle(g, 0.0, 0.025) + 0.05
    before = g.limit
    for _ in range(5):
        now += 0.001
        g.on_sample(Sample(now - 0.0375, 0.0375, g.limit, False, g.limit), now)
    assert g.limit == before


def test_not_binding_shrinks_toward_peak_inflight() -> None:
    """Windows whose peak in-flight is far below the limit bring it down to peak * headroom."""
    g = make(initial_limit=200)
    now = settle(g, 0.0, 0.025)
    for _ in range(3):
        now = feed_window(g, now, 0.025, inflight=10)
    assert g.limit <= int(10 * 1.25 + 10**0.5)
    assert g.limit >= 10


def test_shrink_can_be_switched_off() -> None:
    """shrink_headroom=0 keeps the limit where it was while not binding."""
    g = make(initial_limit=200, shrink_headroom=0)
    now = settle(g, 0.0, 0.025)
    limit = g.limit
    now = feed_window(g, now, 0.025, inflight=10)
    assert g.limit == limit


def test_drop_faster_than_the_floor_is_not_congestion() -> None:
    """A request that failed sooner than the no-load RTT (its deadline ran out): no backoff."""
    g = make()
    now = settle(g, 0.0, 0.025)
    limit = g.limit
    g.on_sample(Sample(now, 0.004, limit, True), now + 0.004)
    assert g.limit == limit
    g.on_sample(Sample(now, 0.5, limit, True), now + 0.5)
    assert g.limit == int(limit * 0.9)


def test_capacity_step_found_within_one_window() -> None:
    """With slow start, 8 -> 64 workers lifts the limit past 64 within one window."""
    g = make()
    now, _ = simulate(g, 0.0, workers=8, windows=20)
    _, limits = simulate(g, now, workers=64, windows=1)
    assert limits[0] >= 64


def test_capacity_drop_after_idle_headroom_starts_low() -> None:
    """After a phase where in-flight stayed at 30 of a limit of 200, the limit is near 30."""
    g = make(initial_limit=200)
    now = settle(g, 0.0, 0.025)
    for _ in range(4):
        now = feed_window(g, now, 0.025, inflight=30)
    assert g.limit <= 30 * 1.25 + 30**0.5 + 1


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"slow_start_tolerance": -1}, "slow_start"),
        ({"shrink_headroom": 0.5}, "shrink_headroom"),
    ],
)
def test_rejects_bad_new_parameters(kw: dict[str, object], field: str) -> None:
    """Invalid slow-start or shrink parameters raise ValueError naming the parameter."""
    with pytest.raises(ValueError, match=field):
        make(**kw)


samples = st.lists(
    st.tuples(
        st.floats(0.0, 0.2),  # time advance (s)
        st.floats(0.001, 0.2),  # rtt (s)
        st.floats(0.0, 1.5),  # inflight as a fraction of the current limit
        st.floats(0.5, 2.0),  # limit at start as a fraction of the current limit
        st.booleans(),  # dropped
    ),
    max_size=300,
)


@settings(max_examples=80, deadline=None)
@given(seq=samples)
def test_between_windows_one_sample_adds_at_most_one_step(
    seq: list[tuple[float, float, float, float, bool]],
) -> None:
    """Outside window closes and probes, a sample moves the limit up by <= slow_start_step
    (rounded up to a whole permit),
    and only a success that started at the limit of its time with RTT near the floor."""
    g = make()
    now = 0.0
    for dt, rtt, frac, then_frac, drop in seq:
        now += dt
        before, windows, probes, probing = g.limit, g.windows, g.probes, g.probing
        noload = g.rtt_noload_s
        held, then = int(frac * before), max(1, int(then_frac * before))
        g.on_sample(Sample(now - rtt, rtt, held, drop, then), now)
        if g.windows != windows or g.probes != probes or probing or g.probing:
            continue
        assert g.limit <= before + math.ceil(g.slow_start_step)  # whole permits
        if g.limit > before:
            assert not drop and noload is not None
            assert rtt <= g.slow_start_tolerance * noload
            assert held >= g.binding_ratio * min(then, before) and 2 * held >= before


def run_windows(g: GradientLimit, now: float, rtt: float, n: int) -> float:
    """``n`` windows of binding samples at ``rtt``, no probe in between."""
    for _ in range(n):
        now = feed_window(g, now, rtt)
    return now


def test_tolerated_queue_does_not_start_a_stuck_probe() -> None:
    """RTT at 2x the floor (ratio 0.5, about the tolerated equilibrium at 8 workers plus
    noise) for many windows: queueing the controller chose, no probe at probe_limit."""
    g = make()
    now = settle(g, 0.0, 0.025)
    probes = g.probes
    run_windows(g, now, 0.05, 8)
    assert g.probes == probes
    assert not g.probing


def test_moved_floor_still_starts_a_stuck_probe() -> None:
    """RTT at 5x the floor (the backend got 5x slower) for a few windows starts a probe."""
    g = make()
    now = settle(g, 0.0, 0.025)
    for _ in range(10):  # the first 2 * stuck_windows after a probe never start one
        now = feed_window(g, now, 0.125)
        if g.probing:
            break
    assert g.probing
    assert g.limit == g.probe_limit


def test_stuck_threshold_without_queue_tolerance_is_the_raw_ratio() -> None:
    """queue_tolerance=1 gives the old rule: ratio 0.45 for a few windows starts a probe."""
    g = make(queue_tolerance=1.0)
    now = settle(g, 0.0, 0.025)
    for _ in range(10):
        now = feed_window(g, now, 0.025 / 0.45)
        if g.probing:
            break
    assert g.probing
