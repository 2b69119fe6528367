"""The soak report's arithmetic: growth and least-squares slope of RSS."""

from __future__ import annotations

import pytest

from experiments.soak.analysis import rss_summary, slope_per_min


def test_slope_of_a_line_is_its_rate_per_minute() -> None:
    """Points rising 1 MB every 30 s give +2 MB/min."""
    assert slope_per_min([(0.0, 10.0), (30.0, 11.0), (60.0, 12.0)]) == pytest.approx(2.0)


def test_slope_needs_two_distinct_times() -> None:
    """Fewer than two points, or one instant, has no slope."""
    assert slope_per_min([(5.0, 1.0)]) is None
    assert slope_per_min([(5.0, 1.0), (5.0, 2.0)]) is None


def test_summary_measures_growth_after_warm_up() -> None:
    """Growth is end vs the first sample after warm-up; the warm-up ramp is ignored."""
    samples = [[0.0, 40.0], [60.0, 64.0], [300.0, 64.5], [600.0, 66.0]]
    out = rss_summary(samples, warmup_s=60.0)
    assert out["warm_mb"] == 64.0 and out["end_mb"] == 66.0 and out["max_mb"] == 66.0
    assert out["growth_pct"] == pytest.approx(3.12, abs=0.01)
    assert out["target_met"] is True
    assert rss_summary([[60.0, 50.0], [600.0, 60.0]], 60.0)["target_met"] is False


def test_summary_without_samples_after_warm_up_is_an_error() -> None:
    """A run shorter than the warm-up cannot be judged."""
    with pytest.raises(RuntimeError, match="warm-up"):
        rss_summary([[1.0, 50.0]], warmup_s=60.0)
