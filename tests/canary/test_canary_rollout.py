"""The canary's state machine (ramp, rollback, promotion) and the latency baseline."""

from __future__ import annotations

import pytest

from ballast_asgi.canary.core.blocks import LatencyBaseline, Version
from ballast_asgi.canary.core.judges import FixedHorizonJudge, SequentialJudge, ThresholdJudge
from ballast_asgi.canary.core.rollout import RampPlan, Rollout, State


def _traffic(
    ro: Rollout, start: float, seconds: int, *, canary_fail_every: int = 0, per_s: int = 20
) -> float:
    """Feed ``per_s`` requests a second (one in ten canary); return the end time."""
    t = start
    for i in range(seconds * per_s):
        t = start + i / per_s
        canary = i % 10 == 0
        failed = canary and canary_fail_every > 0 and (i // 10) % canary_fail_every == 0
        ro.record(Version.CANARY if canary else Version.STABLE, failed, 0.02, t)
    return t


def test_a_failing_canary_is_rolled_back_with_reason_and_evidence() -> None:
    """Half the canary's requests failing: rolled back, weight 0, evidence kept."""
    ro = Rollout(SequentialJudge(), now=0.0, weight=0.1)
    _traffic(ro, 0.0, 60, canary_fail_every=2)
    assert ro.state is State.ROLLED_BACK and ro.weight == 0.0
    assert ro.decision is not None and ro.decision.reason == "errors"
    assert ro.decision.evidence["counts"]["canary"]["errors"] > 0
    assert ro.snapshot(60.0)["decision"]["reason"] == "errors"


def test_after_a_decision_records_are_ignored() -> None:
    """In-flight canary requests finishing after the rollback change nothing."""
    ro = Rollout(SequentialJudge(), now=0.0)
    ro.rollback(1.0, "operator")
    before = ro.snapshot(2.0)["counts"]
    _traffic(ro, 2.0, 5)
    assert ro.snapshot(8.0)["counts"] == before


def test_operator_promote_then_rollback_keeps_the_first_decision() -> None:
    """Decisions are final: a promoted canary stays promoted (weight 1)."""
    ro = Rollout(SequentialJudge(), now=0.0, weight=0.2)
    assert ro.weight == 0.2 and ro.state is State.RUNNING
    assert ro.promote(5.0).state is State.PROMOTED
    assert ro.rollback(6.0).state is State.PROMOTED and ro.weight == 1.0


def test_ramp_steps_advance_then_promote() -> None:
    """1 % -> 5 % -> 25 % -> 50 % -> promoted, each step after its time and request count."""
    plan = RampPlan(steps=(0.01, 0.05, 0.25, 0.5), step_s=10.0, min_requests=5)
    ro = Rollout(SequentialJudge(), now=0.0, plan=plan)
    seen = []
    t = 0.0
    while ro.state is State.RUNNING and t < 100:
        seen.append(ro.weight)
        t = _traffic(ro, t + 0.05, 1)
    assert ro.state is State.PROMOTED and ro.decision is not None
    assert ro.decision.reason == "ramp_complete"
    assert sorted(set(seen)) == [0.01, 0.05, 0.25, 0.5]


def test_low_traffic_holds_the_step() -> None:
    """A step without its minimum of canary requests waits instead of advancing."""
    plan = RampPlan(steps=(0.1, 0.5), step_s=1.0, min_requests=1000)
    ro = Rollout(SequentialJudge(), now=0.0, plan=plan)
    _traffic(ro, 0.0, 120)
    assert ro.state is State.RUNNING and ro.step == 0


def test_a_ramp_shorter_than_the_fixed_horizon_waits_for_the_test() -> None:
    """Fixed horizon 120 s, ramp 2 x 10 s: the last step holds until the test ran, then promotes."""
    plan = RampPlan(steps=(0.1, 0.5), step_s=10.0, min_requests=5)
    ro = Rollout(FixedHorizonJudge(horizon_s=120.0), now=0.0, plan=plan)
    t = _traffic(ro, 0.0, 100)
    assert ro.state is State.RUNNING and ro.step == 1 and ro.weight == 0.5
    end = _traffic(ro, t + 0.05, 40)
    assert ro.snapshot(end)["state"] == "promoted" and ro.decision is not None
    assert ro.decision.at >= 120.0 and ro.decision.evidence["z"] is not None


def test_threshold_rule_drives_the_same_machine() -> None:
    """The Flagger-like baseline plugs into the rollout too."""
    ro = Rollout(ThresholdJudge(), now=0.0)
    _traffic(ro, 0.0, 400, canary_fail_every=10)
    assert ro.state is State.ROLLED_BACK and ro.snapshot(400.0)["rule"] == "threshold"


def test_ramp_plan_is_validated() -> None:
    """Steps must be weights in (0, 1] and must not go down."""
    with pytest.raises(ValueError, match="not decrease"):
        RampPlan(steps=(0.5, 0.1))
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        RampPlan(steps=(0.0, 0.1))


def test_latency_baseline_tracks_the_stable_quantile() -> None:
    """With 1..1000 ms spread evenly, the p99 threshold lands near 990 ms (5 % buckets)."""
    base = LatencyBaseline(quantile=0.99, window=3, min_samples=100)
    assert base.threshold_s is None
    for ms in range(1, 1001):
        base.add(ms / 1000)
    base.roll()
    assert base.threshold_s is not None and 0.98 <= base.threshold_s <= 1.05


def test_latency_baseline_forgets_old_blocks() -> None:
    """Blocks older than the window no longer move the threshold."""
    base = LatencyBaseline(quantile=0.5, window=2, min_samples=10)
    for _ in range(100):
        base.add(1.0)
    base.roll()
    for _ in range(2):
        for _ in range(100):
            base.add(0.01)
        base.roll()
    assert base.threshold_s is not None and base.threshold_s < 0.02
