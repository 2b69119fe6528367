"""``experiments.anchors.plan``: the four scenarios' specifications and schedules (pure)."""

from __future__ import annotations

import itertools

import pytest

from experiments.anchors import plan as ap
from experiments.anchors import run


def _rates(run: ap.AnchorRun, t0: float, t1: float) -> list[float]:
    """Arrivals per second of each tier intended in ``[t0, t1)``."""
    s = ap.schedule(run)
    counts = [0, 0, 0]
    for t, i in zip(s.offsets_s, s.tier_ids, strict=True):
        if t0 <= t < t1:
            counts[i] += 1
    return [c / (t1 - t0) for c in counts]


def test_spike_steps_from_half_capacity_to_each_load() -> None:
    """Scenario 1 offers 0.5x before the step and 1.4x / 4x after it, 5/35/60 mixed."""
    runs = ap.spike(ap.FULL, ap.SPIKE_LOADS, ("gradient",))
    assert [r.load_x for r in runs] == [1.4, 4.0]
    for r in runs:
        assert r.change_s == ap.FULL.spike_before_s
        before = _rates(r, 0.0, r.change_s)
        after = _rates(r, r.change_s, r.duration_s)
        assert sum(before) == pytest.approx(125.0, rel=0.01)
        assert sum(after) == pytest.approx(r.load_x * 250.0, rel=0.01)
        assert after[0] / sum(after) == pytest.approx(0.05, rel=0.02)


def test_priority_spikes_only_bulk_twelvefold() -> None:
    """Scenario 2: critical and standard steady, bulk x12 during the middle phase only."""
    (run,) = ap.priority(ap.FULL, ("gradient",))
    spike_end = run.change_s + ap.FULL.priority_spike_s
    before = _rates(run, 0.0, run.change_s)
    during = _rates(run, run.change_s, spike_end)
    after = _rates(run, spike_end, run.duration_s)
    assert before == pytest.approx([40.0, 60.0, 100.0])
    assert during == pytest.approx([40.0, 60.0, 1200.0])
    assert after == pytest.approx(before)
    assert run.duration_s == 50.0


def test_detect_ramps_from_zero_then_slows_the_backend() -> None:
    """Scenario 4: Envoy's backend, a linear ramp to 1.5x, then a 5x slowdown after the hold."""
    (run,) = ap.detect(ap.FULL)
    assert run.backend == ap.ENVOY and run.deadlines_s == (1.0, 1.0, 1.0)
    assert pytest.approx(145.45, rel=1e-3) == ap.ENVOY_CAPACITY_RPS
    assert run.events == ((170.0, {"latency_multiplier": 5.0}),)
    assert run.change_s == 170.0
    early, late = sum(_rates(run, 0.0, 16.0)), sum(_rates(run, 144.0, 160.0))
    top = 1.5 * ap.ENVOY_CAPACITY_RPS
    assert early == pytest.approx(top * 0.05, rel=0.05)  # mean rate over the first tenth
    assert late == pytest.approx(top * 0.95, rel=0.02)


def test_ramp_arrivals_follow_the_integral() -> None:
    """A ramp's arrivals start at once, grow denser, and total the rate's integral."""
    phase = ap.Phase(10.0, (0.0, 0.0, 0.0), (0.0, 0.0, 100.0))
    times = ap.arrivals(5.0, phase, 2)
    assert len(times) == 500  # (0 + 100) / 2 * 10
    assert times[0] == 5.0 and times[-1] < 15.0
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(g2 <= g1 + 1e-12 for g1, g2 in itertools.pairwise(gaps))
    assert ap.arrivals(0.0, ap.Phase(2.0, (0.0, 0.0, 4.0)), 2) == [0.0, 0.25, 0.5, 0.75, 1.0,
                                                                   1.25, 1.5, 1.75]  # fmt: skip


def test_schedule_is_sorted_and_tier_deadlines_are_the_runs() -> None:
    """The merged schedule is in time order and its tiers carry the run's deadlines."""
    run = ap.priority(ap.QUICK, ("gradient",))[0]
    s = ap.schedule(run)
    assert s.offsets_s == sorted(s.offsets_s)
    assert [t.deadline_s for t in s.tiers] == [0.4, 1.0, 3.0]
    assert [t.name for t in s.tiers] == ["critical", "standard", "bulk"]


def test_full_plan_fits_half_an_hour_and_quick_a_few_minutes() -> None:
    """The default lengths total under 30 minutes of load; --quick under 4 minutes."""
    full = ap.full_plan(ap.FULL)
    quick = ap.full_plan(ap.QUICK)
    assert {r.scenario for r in full} == set(ap.SCENARIOS)
    assert sum(r.duration_s for r in full) / 60 < 30
    assert sum(r.duration_s for r in quick) / 60 < 4
    assert next(r for r in full if r.scenario == "steady").duration_s == 600.0


def test_peers_only_in_the_spike_and_priority_tables() -> None:
    """HAProxy rows run where a fixed limit does; without peers the plan has none."""
    with_peers = ap.full_plan(ap.QUICK, peers=True)
    peers = {r.scenario for r in with_peers if r.limiter.startswith("haproxy-")}
    assert peers == {"spike", "priority"}
    assert not any(r.limiter.startswith("haproxy") for r in ap.full_plan(ap.QUICK, peers=False))


def test_unknown_scenario_or_limiter_is_refused_with_the_choices() -> None:
    """A typo in --only or --limiters stops at once and names what exists."""
    with pytest.raises(SystemExit, match="choose from spike, priority, steady, detect"):
        run.main(["--quick", "--only", "spikes"])
    with pytest.raises(SystemExit, match=r"not in the plan; choose from .*gradient"):
        run.main(["--quick", "--limiters", "gradient,grdient"])
