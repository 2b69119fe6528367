"""The limiter: permits against the algorithm's limit, exactly-once release, estimates."""

from __future__ import annotations

import json

import pytest

from ballast_asgi.core.limit import FixedLimit, Sample
from ballast_asgi.core.limiter import Limiter, live_limiters
from ballast_asgi.core.outcome import Outcome
from tests.fakes import RecordingLimit


def test_acquire_up_to_the_limit_then_refuse() -> None:
    """try_acquire grants `limit` permits and then returns None."""
    lim = Limiter(FixedLimit(2))
    a, b = lim.try_acquire(0.0), lim.try_acquire(0.0)
    assert a is not None and b is not None
    assert lim.try_acquire(0.0) is None
    assert lim.inflight == 2
    a.release(Outcome.SUCCESS, 0.1)
    b.release(Outcome.SUCCESS, 0.1)
    assert lim.inflight == 0


def test_success_is_an_rtt_sample_with_inflight_at_start() -> None:
    """A SUCCESS release feeds the algorithm its RTT, in-flight and limit at start."""
    algo = RecordingLimit(4)
    lim = Limiter(algo)
    p1 = lim.try_acquire(1.0)
    p2 = lim.try_acquire(1.5)
    assert p1 is not None and p2 is not None
    p2.release(Outcome.SUCCESS, 1.75)
    p1.release(Outcome.DROPPED, 3.0)
    assert algo.samples == [Sample(1.5, 0.25, 2, False, 4), Sample(1.0, 2.0, 1, True, 4)]


def test_ignored_release_is_no_sample() -> None:
    """IGNORED (client gone, shed downstream) feeds the algorithm nothing."""
    algo = RecordingLimit(4)
    lim = Limiter(algo)
    p = lim.try_acquire(0.0)
    assert p is not None
    p.release(Outcome.IGNORED, 5.0)
    assert algo.samples == []
    assert lim.throughput_rps(5.0) == 0.0


def test_second_release_is_counted_and_ignored() -> None:
    """Releasing twice decrements in-flight once and counts the double release."""
    lim = Limiter(FixedLimit(4))
    p = lim.try_acquire(0.0)
    assert p is not None
    p.release(Outcome.SUCCESS, 0.1)
    p.release(Outcome.SUCCESS, 0.2)
    assert lim.inflight == 0
    assert lim.double_releases == 1


def test_max_limit_caps_the_algorithm() -> None:
    """max_limit caps whatever the algorithm says."""
    lim = Limiter(FixedLimit(100), max_limit=3)
    assert lim.limit == 3


def test_on_release_callback_runs_after_release_without_reentry() -> None:
    """The callback sees the freed slot; a release inside it does not re-enter it."""
    lim = Limiter(FixedLimit(1))
    calls: list[tuple[float, int]] = []

    def on_release(now: float) -> None:
        calls.append((now, lim.inflight))
        inner = lim.try_acquire(now)
        assert inner is not None
        inner.release(Outcome.IGNORED, now)

    lim.set_on_release(on_release)
    p = lim.try_acquire(0.0)
    assert p is not None
    p.release(Outcome.SUCCESS, 0.5)
    assert calls == [(0.5, 0)]


def test_throughput_counts_recent_completions() -> None:
    """throughput_rps is completions per second over the recent window."""
    lim = Limiter(FixedLimit(1000), throughput_window_s=2.0)
    for i in range(200):
        p = lim.try_acquire(i * 0.01)
        assert p is not None
        p.release(Outcome.SUCCESS, i * 0.01 + 0.005)
    assert lim.throughput_rps(2.0) == pytest.approx(100.0, rel=0.1)
    assert lim.throughput_rps(100.0) == 0.0


def test_rtt_min_is_windowed_and_can_rise() -> None:
    """The minimum RTT forgets samples older than its window."""
    lim = Limiter(FixedLimit(10), rtt_min_window_s=1.0)
    for start, rtt in ((0.0, 0.01), (5.0, 0.2)):
        p = lim.try_acquire(start)
        assert p is not None
        p.release(Outcome.SUCCESS, start + rtt)
    assert lim.rtt_min_s == pytest.approx(0.2)


def test_snapshot_is_json_safe() -> None:
    """The snapshot carries the pinned keys and serialises to JSON."""
    lim = Limiter(FixedLimit(5))
    p = lim.try_acquire(0.0)
    assert p is not None
    p.release(Outcome.SUCCESS, 0.02)
    snap = lim.snapshot(now=0.02)
    for key in ("algorithm", "limit", "inflight", "rtt_recent_s", "rtt_min_s"):
        assert key in snap
    assert snap["algorithm"] == "fixed"
    json.dumps(snap)


def test_live_limiters_are_tracked() -> None:
    """Every live limiter is visible to the leak-checking fixture."""
    lim = Limiter(FixedLimit(1))
    assert lim in live_limiters()


def test_rejects_bad_parameters() -> None:
    """Invalid constructor arguments raise ValueError naming the field."""
    with pytest.raises(ValueError, match="max_limit"):
        Limiter(FixedLimit(1), max_limit=0)
    with pytest.raises(ValueError, match="rtt_ewma_alpha"):
        Limiter(FixedLimit(1), rtt_ewma_alpha=0.0)


def test_set_algorithm_keeps_permits_and_wakes_waiters() -> None:
    """Swapping the algorithm keeps in-flight and, with now, runs the release callback."""
    lim = Limiter(FixedLimit(1))
    woken: list[float] = []
    lim.set_on_release(woken.append)
    p = lim.try_acquire(0.0)
    assert p is not None
    lim.set_algorithm(FixedLimit(3), max_limit=2, now=1.0)
    assert lim.limit == 2 and lim.inflight == 1 and woken == [1.0]
    p.release(Outcome.IGNORED, 2.0)
