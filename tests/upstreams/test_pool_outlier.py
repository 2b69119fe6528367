"""Outlier detection: consecutive failures, relative success rate, growing ejections, cap."""

from __future__ import annotations

import random

import pytest

from ballast_asgi.upstreams.core.outlier import (
    OutlierDetector,
    OutlierPolicy,
    OutlierState,
    max_ejected,
)


def _pool(n: int = 3, **kw: float) -> tuple[OutlierDetector, list[OutlierState]]:
    det = OutlierDetector(OutlierPolicy(**kw))  # type: ignore[arg-type]
    return det, [det.new_state() for _ in range(n)]


def test_consecutive_gateway_failures_eject() -> None:
    """Five gateway failures in a row eject; a success in between resets the run."""
    det, states = _pool()
    s = states[0]
    for _ in range(4):
        assert not det.record(s, states, 1.0, failure=True, gateway_failure=True)
    det.record(s, states, 1.0, failure=False, gateway_failure=False)
    for _ in range(4):
        det.record(s, states, 1.0, failure=True, gateway_failure=True)
    assert not s.ejected(1.0)
    assert det.record(s, states, 1.0, failure=True, gateway_failure=True)
    assert s.ejected(1.0) and s.ejected(5.99) and not s.ejected(6.0)


def test_plain_500s_do_not_feed_the_consecutive_rule() -> None:
    """Failures that are not gateway failures (a 500) never eject by the consecutive rule."""
    det, states = _pool()
    for _ in range(50):
        det.record(states[0], states, 1.0, failure=True, gateway_failure=False)
    assert not states[0].ejected(1.0)


def _feed(
    det: OutlierDetector,
    states: list[OutlierState],
    rates: list[float],
    now: float,
    n: int,
    rng: random.Random,
) -> None:
    for _ in range(n):
        for s, rate in zip(states, rates, strict=True):
            det.record(s, states, now, failure=rng.random() < rate, gateway_failure=False)


def test_success_rate_rule_ejects_the_outlier() -> None:
    """An instance failing half its calls is ejected against two that fail 1 %."""
    det, states = _pool()
    _feed(det, states, [0.5, 0.01, 0.01], 0.1, 40, random.Random(5))
    ejected = det.evaluate(states, 0.2)
    assert ejected == [states[0]]


def test_success_rate_rule_needs_enough_calls() -> None:
    """Below min_requests nothing is judged."""
    det, states = _pool()
    _feed(det, states, [1.0, 0.0, 0.0], 0.1, 10, random.Random(6))
    assert det.evaluate(states, 0.2) == []


def test_success_rate_rule_spares_a_pool_failing_alike() -> None:
    """When every instance fails alike, none is an outlier."""
    det, states = _pool()
    _feed(det, states, [0.5, 0.5, 0.5], 0.1, 200, random.Random(7))
    assert det.evaluate(states, 0.2) == []


def test_success_rate_rule_runs_once_per_interval() -> None:
    """Evaluation is throttled to interval_ms."""
    det, states = _pool()
    assert det.evaluate(states, 0.0) == []
    _feed(det, states, [1.0, 0.0, 0.0], 0.01, 40, random.Random(8))
    assert det.evaluate(states, 0.1) == []  # within 250 ms of the last run
    assert det.evaluate(states, 0.26) == [states[0]]


def test_no_false_ejections_at_one_percent_noise() -> None:
    """One percent random errors on every instance eject nothing over a long run."""
    det, states = _pool()
    rng = random.Random(9)
    out = 0
    for step in range(2_400):  # 10 minutes in 250 ms steps, 50 calls per instance per step
        now = step * 0.25
        _feed(det, states, [0.01, 0.01, 0.01], now, 50, rng)
        out += len(det.evaluate(states, now))
    assert out == 0 and all(s.ejections == 0 for s in states)


def test_ejection_time_grows_and_decays() -> None:
    """Repeated ejections last base, 2x base, ...; after a quiet max period it is base again."""
    det, states = _pool(base_ejection_ms=1_000, max_ejection_ms=3_000)
    s = states[0]

    def eject(now: float) -> float:
        for _ in range(5):
            det.record(s, states, now, failure=True, gateway_failure=True)
        return s.ejected_until - now

    assert eject(0.0) == pytest.approx(1.0)
    assert eject(1.0) == pytest.approx(2.0)
    assert eject(3.0) == pytest.approx(3.0)
    assert eject(6.0) == pytest.approx(3.0)  # capped
    assert eject(20.0) == pytest.approx(1.0)  # quiet for longer than max: back to base


def test_cap_on_ejected_share() -> None:
    """With 50 % of three, one instance may be out at a time; the second stays in."""
    det, states = _pool()
    for s in states[:2]:
        for _ in range(5):
            det.record(s, states, 1.0, failure=True, gateway_failure=True)
    assert [s.ejected(1.0) for s in states] == [True, False, False]
    assert max_ejected(3, 50.0) == 1 and max_ejected(10, 50.0) == 5 and max_ejected(2, 0.0) == 1


def test_disabled_detector_never_ejects() -> None:
    """enabled=False records nothing."""
    det = OutlierDetector(OutlierPolicy(enabled=False))
    states = [det.new_state() for _ in range(3)]
    for _ in range(10):
        assert not det.record(states[0], states, 0.0, failure=True, gateway_failure=True)
    assert det.evaluate(states, 1.0) == []


def test_policy_validation_names_the_field() -> None:
    """A bad setting raises naming it."""
    with pytest.raises(ValueError, match="consecutive_failures"):
        OutlierPolicy(consecutive_failures=0)
    with pytest.raises(ValueError, match="base_ejection_ms"):
        OutlierPolicy(base_ejection_ms=10, max_ejection_ms=5)
