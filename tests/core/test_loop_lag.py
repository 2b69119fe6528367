"""The gateway's own event-loop lag kept out of the controller's signal (ADR 0010)."""

from __future__ import annotations

import asyncio
import random

import pytest

from ballast_asgi.config import GatewayConfig
from ballast_asgi.core.limit import FixedLimit, GradientLimit, Sample
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.loop_lag import LoopLag
from ballast_asgi.core.outcome import Outcome
from ballast_asgi.gateway.stack import build_parts, reconfigure_parts
from ballast_asgi.telemetry.loop_lag import LoopLagMonitor
from ballast_asgi.telemetry.metrics import Metrics

WINDOW_S = 0.5


class FakeClock:
    """A settable clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the pure core ---------------------------------------------------------------


def test_no_lag_before_the_first_tick_and_on_time_ticks() -> None:
    """Ticks that run when due leave the estimate at 0."""
    lag = LoopLag(period_s=0.005)
    assert lag.estimate(1.0) == 0.0
    for i in range(10):
        lag.tick(1.0 + i * 0.005)
    assert lag.estimate(1.045) == pytest.approx(0.0, abs=1e-12)


def test_late_ticks_raise_the_mean_by_alpha() -> None:
    """A tick 20 ms late moves the mean a fifth of the way (alpha 0.2)."""
    lag = LoopLag(period_s=0.005, alpha=0.2)
    lag.tick(0.0)
    lag.tick(0.025)  # due at 0.005: 20 ms late
    assert lag.mean_s == pytest.approx(0.004)
    assert lag.estimate(0.026) == pytest.approx(0.004)


def test_an_overdue_tick_counts_while_the_loop_is_stuck() -> None:
    """30 ms after the next tick was due, the estimate is at least 30 ms."""
    lag = LoopLag(period_s=0.005)
    lag.tick(0.0)
    assert lag.estimate(0.035) == pytest.approx(0.030)


@pytest.mark.parametrize(("kw", "field"), [({"period_s": 0}, "period_s"), ({"alpha": 0}, "alpha")])
def test_rejects_bad_parameters(kw: dict[str, float], field: str) -> None:
    """Bad parameters are refused with the name of the parameter."""
    with pytest.raises(ValueError, match=field):
        LoopLag(**kw)


def test_sample_backend_rtt_subtracts_the_lag_and_stays_positive() -> None:
    """backend_rtt_s is rtt minus lag, floored above zero."""
    assert Sample(0.0, 0.05, 1, lag_s=0.02).backend_rtt_s == pytest.approx(0.03)
    assert Sample(0.0, 0.05, 1, lag_s=0.2).backend_rtt_s > 0.0


# -- the limiter passes it on -------------------------------------------------------


class Recorder(FixedLimit):
    """A fixed limit that keeps the samples it was given."""

    def __init__(self) -> None:
        super().__init__(10)
        self.samples: list[Sample] = []

    def on_sample(self, sample: Sample, now: float) -> int:
        self.samples.append(sample)
        return self.limit


def test_limiter_puts_the_lag_in_every_sample_and_the_snapshot() -> None:
    """The source's reading goes into the sample; the limiter's own RTT stays raw."""
    algo = Recorder()
    limiter = Limiter(algo, loop_lag=lambda: 0.02)
    limiter.try_acquire(1.0).release(Outcome.SUCCESS, 1.05)  # type: ignore[union-attr]
    assert algo.samples[0].lag_s == 0.02
    assert algo.samples[0].rtt_s == pytest.approx(0.05)
    assert limiter.rtt_min_s == pytest.approx(0.05)
    assert limiter.snapshot()["loop_lag_s"] == 0.02
    assert Limiter(FixedLimit(4)).snapshot()["loop_lag_s"] is None


# -- the gradient does not read the gateway's lag as backend queueing ---------------


def _windows(g: GradientLimit, now: float, rtt: float, lag: float, windows: int) -> float:
    """Binding windows of 20 samples at ``rtt`` (of which ``lag`` is the gateway's)."""
    for _ in range(windows):
        for _ in range(20):
            now += WINDOW_S / 20
            g.on_sample(Sample(now - rtt, rtt, g.limit, False, lag_s=lag), now)
    return now


def _settled() -> tuple[GradientLimit, float]:
    g = GradientLimit(initial_limit=20, min_limit=4, max_limit=1000, rng=random.Random(1))
    now = _windows(g, 0.0, 0.025, 0.0, 4)
    assert g.probes and not g.probing
    return g, now


def test_loop_lag_alone_does_not_cut_the_limit() -> None:
    """RTT 3x the floor, all of it the gateway's own lag: the limit does not fall."""
    g, now = _settled()
    before = g.limit
    _windows(g, now, 0.075, 0.050, 3)
    assert g.limit >= before


def test_the_same_rtt_without_lag_cuts_it() -> None:
    """The same RTT with no loop lag is backend queueing: the limit is cut."""
    g, now = _settled()
    before = g.limit
    _windows(g, now, 0.075, 0.0, 1)
    assert g.limit < before


def test_backend_queueing_under_lag_still_cuts() -> None:
    """Lag 50 ms on top of a backend 3x slower than its floor still cuts the limit."""
    g, now = _settled()
    before = g.limit
    _windows(g, now, 0.075 + 0.050, 0.050, 1)
    assert g.limit < before


# -- the driver --------------------------------------------------------------------


def test_monitor_reads_zero_outside_a_loop() -> None:
    """Outside a running loop there is nothing to measure."""
    assert LoopLagMonitor()() == 0.0


@pytest.mark.anyio
async def test_monitor_starts_on_the_running_loop_and_measures_late_ticks() -> None:
    """The first reading starts the tick; a tick run late by the fake clock shows as lag."""
    clock = FakeClock()
    monitor = LoopLagMonitor(period_s=0.005, alpha=1.0, clock=clock)
    try:
        assert monitor() == 0.0
        assert monitor._handle is not None
        clock.now += 0.045  # the next tick (due at +5 ms) runs 40 ms late
        monitor._tick()
        assert monitor() == pytest.approx(0.040)
        assert monitor.lag.ticks == 1
    finally:
        monitor.stop()
    assert monitor._handle is None


@pytest.mark.anyio
async def test_monitor_restarts_on_another_loop() -> None:
    """A reading from a different loop starts a fresh tick there."""
    monitor = LoopLagMonitor()
    try:
        monitor()
        first = monitor._loop
        monitor._loop = None  # as if the reading came from another loop
        monitor()
        assert monitor._loop is first is asyncio.get_running_loop()
    finally:
        monitor.stop()


@pytest.mark.anyio
async def test_monitor_knows_its_loop_without_asking_asyncio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once started, readings on its loop's thread do not call ``get_running_loop`` (a
    ``getpid`` system call each in CPython 3.11); a reading from a thread with no
    running loop still reads 0, and the tick stays on the first loop."""
    monitor = LoopLagMonitor()
    try:
        monitor()
        started = monitor._loop
        asked: list[int] = []
        real = asyncio.get_running_loop

        def counted() -> asyncio.AbstractEventLoop:
            asked.append(1)
            return real()

        monkeypatch.setattr(asyncio, "get_running_loop", counted)
        for _ in range(5):
            monitor()
        assert asked == [] and monitor._loop is started
        assert await asyncio.to_thread(monitor) == 0.0  # another thread: no loop there
        assert asked == [1] and monitor._loop is started
    finally:
        monitor.stop()


def test_build_parts_attaches_the_monitor_and_reload_toggles_it() -> None:
    """limiter.subtract_loop_lag (default on) attaches the monitor; a reload turns it off."""
    on = GatewayConfig()
    parts = build_parts(on, Metrics())
    assert isinstance(parts.limiter.loop_lag, LoopLagMonitor)
    blind = on.limiter.model_copy(update={"subtract_loop_lag": False})
    off = on.model_copy(update={"limiter": blind})
    reconfigure_parts(parts, on, off, 0.0)
    assert parts.limiter.loop_lag is None
    reconfigure_parts(parts, off, on, 0.0)
    assert isinstance(parts.limiter.loop_lag, LoopLagMonitor)
