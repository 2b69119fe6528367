"""The gradient controller: windows, growth, backoff, probes (fed samples, no clock)."""

from __future__ import annotations

import random

import pytest

from ballast_asgi.core.limit import GradientLimit, Sample

WINDOW_S = 0.5


def make(**kw: object) -> GradientLimit:
    params: dict[str, object] = {"initial_limit": 20, "min_limit": 4, "max_limit": 1000}
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
    assert g.limit == 30  # restored: 20 grown x1.5 by the binding first window


def test_grows_multiplicatively_when_binding_at_the_floor() -> None:
    """Binding with latency at the no-load RTT multiplies the limit each window."""
    g = make()
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
