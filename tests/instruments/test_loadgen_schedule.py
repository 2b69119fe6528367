"""Arrival schedules and duration parsing (pure, seeded)."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast_tools.loadgen.schedule import DEFAULT_TIERS, build_schedule, make_tiers
from ballast_tools.units import format_duration, parse_duration_s


def test_constant_schedule_is_evenly_spaced() -> None:
    """rate x duration arrivals, 1/rate apart, starting at 0."""
    s = build_schedule(200, 2.0, random.Random(1))
    assert len(s) == 400
    assert s.offsets_s[0] == 0.0 and s.offsets_s[1] == pytest.approx(0.005)
    assert s.offsets_s[-1] == pytest.approx(1.995)


def test_poisson_schedule_has_the_right_mean_rate_and_gaps() -> None:
    """Poisson arrivals: count ~ rate x duration, gaps have mean and sd 1/rate."""
    s = build_schedule(1000, 20.0, random.Random(2), poisson=True)
    assert len(s) == pytest.approx(20_000, rel=0.03)
    gaps = [b - a for a, b in zip(s.offsets_s, s.offsets_s[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.001, rel=0.03)
    assert statistics.stdev(gaps) == pytest.approx(0.001, rel=0.05)
    assert all(0 <= t < 20.0 for t in s.offsets_s)


def test_default_tier_mix_is_5_35_60() -> None:
    """The default mix draws critical/standard/bulk in about 5/35/60 shares."""
    s = build_schedule(2000, 10.0, random.Random(3))
    counts = s.count_by_tier()
    assert counts["critical"] / len(s) == pytest.approx(0.05, abs=0.01)
    assert counts["standard"] / len(s) == pytest.approx(0.35, abs=0.015)
    assert counts["bulk"] / len(s) == pytest.approx(0.60, abs=0.015)
    assert [t.deadline_s for t in DEFAULT_TIERS] == [0.4, 1.0, 3.0]


def test_same_seed_same_schedule() -> None:
    """A seed fixes the whole schedule; another seed changes it."""
    a = build_schedule(500, 1.0, random.Random(9), poisson=True)
    b = build_schedule(500, 1.0, random.Random(9), poisson=True)
    c = build_schedule(500, 1.0, random.Random(10), poisson=True)
    assert a == b and a != c


def test_custom_mix_with_a_zero_weight_never_draws_that_tier() -> None:
    """A zero weight removes a tier."""
    s = build_schedule(500, 1.0, random.Random(1), tiers=make_tiers([0, 0, 1], [1, 1, 1]))
    assert s.count_by_tier() == {"critical": 0, "standard": 0, "bulk": 500}


@pytest.mark.parametrize(
    ("mix", "deadlines"), [([1, 2], [1, 1, 1]), ([0, 0, 0], [1, 1, 1]), ([1, 1, 1], [1, 0, 1])]
)
def test_bad_tiers_are_rejected(mix: list[float], deadlines: list[float]) -> None:
    """Wrong lengths, all-zero weights and zero deadlines fail."""
    with pytest.raises(ValueError):
        make_tiers(mix, deadlines)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("25ms", 0.025), ("1.5s", 1.5), ("250us", 0.00025), ("2m", 120.0), ("3", 3.0), (0.5, 0.5)],
)
def test_parse_duration(text: str | float, seconds: float) -> None:
    """Durations carry a unit; bare numbers are seconds."""
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "fast", "-1s", "1h", "nan", True, [1]])
def test_parse_duration_rejects_garbage(text: object) -> None:
    """Anything else is a ValueError with a hint."""
    with pytest.raises(ValueError):
        parse_duration_s(text)  # type: ignore[arg-type]


@given(st.floats(min_value=1e-6, max_value=1e4, allow_nan=False))
def test_format_duration_round_trips(seconds: float) -> None:
    """format_duration writes what parse_duration_s reads back."""
    assert parse_duration_s(format_duration(seconds)) == pytest.approx(seconds, rel=1e-5)
