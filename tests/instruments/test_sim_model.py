"""The simulator's pure core: service times, the worker pool, stats (fake clock, seeded RNG)."""

from __future__ import annotations

import random

import pytest

from ballast_tools.upstream_sim.model import Profile, Service, Simulator, WorkerPool, sample_service

REF = Profile(workers=8, fast_s=0.025, slow_s=0.120)


def test_reference_capacity_is_about_269_rps() -> None:
    """8 workers at 25/120 ms, 5% slow, serve 8 / 29.75 ms = 268.9 rps."""
    assert REF.mean_service_s == pytest.approx(0.02975)
    assert REF.capacity_rps == pytest.approx(268.9, abs=0.1)


def test_latency_multiplier_divides_capacity() -> None:
    """A 5x latency multiplier cuts capacity to a fifth."""
    slow = Profile(8, 0.025, 0.120, latency_multiplier=5)
    assert slow.capacity_rps == pytest.approx(REF.capacity_rps / 5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"workers": 0},
        {"slow_fraction": 1.5},
        {"error_rate": -0.1},
        {"latency_multiplier": 0},
        {"fast_s": -1},
    ],
)
def test_profile_rejects_out_of_range_values(kwargs: dict[str, float]) -> None:
    """Invalid profiles fail at construction."""
    base = {"workers": 8, "fast_s": 0.025, "slow_s": 0.12}
    with pytest.raises(ValueError):
        Profile(**{**base, **kwargs})  # type: ignore[arg-type]


def test_service_time_is_bimodal_with_the_slow_fraction() -> None:
    """About 5% of draws are slow; every draw is one of the two times."""
    rng = random.Random(7)
    draws = [sample_service(REF, rng).duration_s for _ in range(20_000)]
    assert set(draws) == {0.025, 0.120}
    assert draws.count(0.120) / len(draws) == pytest.approx(0.05, abs=0.006)


def test_service_time_scales_with_multiplier_and_errors_follow_rate() -> None:
    """The multiplier scales every draw; error_rate sets the share of errors."""
    p = Profile(2, 0.010, 0.010, latency_multiplier=3, error_rate=0.25)
    rng = random.Random(3)
    draws = [sample_service(p, rng) for _ in range(10_000)]
    assert all(d.duration_s == pytest.approx(0.030) for d in draws)
    assert sum(d.error for d in draws) / len(draws) == pytest.approx(0.25, abs=0.02)


def test_same_seed_same_service_times() -> None:
    """Seeded randomness reproduces the same sequence."""
    a = [sample_service(REF, random.Random(5)).duration_s for _ in range(3)]
    b = [sample_service(REF, random.Random(5)).duration_s for _ in range(3)]
    assert a == b


def test_pool_queues_beyond_workers_and_serves_fifo() -> None:
    """Arrivals past the worker count wait and are handed workers in arrival order."""
    pool: WorkerPool[str] = WorkerPool(2)
    assert pool.arrive("a") and pool.arrive("b")
    assert not pool.arrive("c") and not pool.arrive("d")
    assert pool.queue_len == 2
    assert pool.release() == "c"
    assert pool.release() == "d"
    assert pool.release() is None and pool.busy == 1


def test_growing_starts_queued_requests_at_once() -> None:
    """Adding workers hands them to waiters immediately."""
    pool: WorkerPool[str] = WorkerPool(1)
    for token in "abcd":
        pool.arrive(token)
    assert pool.resize(3) == ["b", "c"]
    assert pool.busy == 3 and pool.queue_len == 1


def test_shrinking_lets_busy_workers_finish_then_retires_them() -> None:
    """Shrinking interrupts nobody: excess workers retire as they finish."""
    pool: WorkerPool[str] = WorkerPool(4)
    for token in "abcdef":
        pool.arrive(token)
    assert pool.resize(2) == []
    assert pool.busy == 4
    assert pool.release() is None  # retires (4 busy > 2)
    assert pool.release() is None  # retires (3 busy > 2)
    assert pool.busy == 2
    assert pool.release() == "e"  # now at the target: it takes the next waiter
    assert pool.busy == 2


def test_removed_waiter_is_never_served() -> None:
    """A waiter that leaves the queue is skipped."""
    pool: WorkerPool[str] = WorkerPool(1)
    pool.arrive("a")
    pool.arrive("b")
    assert pool.remove("b") and not pool.remove("b")
    assert pool.release() is None


def test_stats_record_queue_wait_and_outcomes() -> None:
    """Queue wait is start minus arrival; served, errored and late finishes are counted."""
    sim: Simulator[str] = Simulator(Profile(1, 0.01, 0.01), random.Random(1))
    assert sim.arrive("a")
    assert not sim.arrive("b")
    svc_a = sim.begin(arrived_s=10.0, deadline_s=10.5, now=10.0)
    assert sim.end(svc_a, deadline_s=10.5, now=10.01) == "b"
    svc_b = sim.begin(arrived_s=10.0, deadline_s=10.005, now=10.01)
    sim.end(Service(svc_b.duration_s, error=True), deadline_s=10.005, now=10.02)
    snap = sim.snapshot()
    assert snap["arrived"] == 2 and snap["served"] == 1 and snap["errored"] == 1
    assert snap["finished_after_deadline"] == 1
    assert snap["max_queue_len"] == 1
    assert snap["queue_wait_ms"]["max"] == pytest.approx(10.0, rel=0.01)


def test_drop_expired_skips_service_for_late_requests() -> None:
    """With drop_expired, a request past its deadline at a worker gets no service."""
    sim: Simulator[str] = Simulator(Profile(1, 0.01, 0.01, drop_expired=True), random.Random(1))
    sim.arrive("a")
    svc = sim.begin(arrived_s=0.0, deadline_s=0.5, now=0.6)
    assert svc.expired and svc.duration_s == 0
    sim.end(svc, deadline_s=0.5, now=0.6)
    snap = sim.snapshot()
    assert snap["dropped_expired"] == 1 and snap["served"] == 0
    assert snap["finished_after_deadline"] == 0


def test_deadlines_are_only_recorded_by_default() -> None:
    """Without drop_expired a late request is still served (and counted as late)."""
    sim: Simulator[str] = Simulator(Profile(1, 0.01, 0.01), random.Random(1))
    sim.arrive("a")
    svc = sim.begin(arrived_s=0.0, deadline_s=0.5, now=0.6)
    assert not svc.expired
    sim.end(svc, deadline_s=0.5, now=0.61)
    assert sim.stats.served == 1 and sim.stats.finished_after_deadline == 1


def test_set_profile_resizes_live_and_reset_clears_counters() -> None:
    """A new profile resizes the pool; reset_stats zeroes counters but keeps the queue."""
    sim: Simulator[str] = Simulator(Profile(1, 0.01, 0.01), random.Random(1))
    for token in "abc":
        sim.arrive(token)
    assert sim.set_profile(Profile(3, 0.01, 0.01)) == ["b", "c"]
    sim.reset_stats()
    snap = sim.snapshot()
    assert snap["arrived"] == 0 and snap["busy"] == 3 and snap["workers"] == 3
