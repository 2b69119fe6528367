"""The log-linear histogram: relative error, merge, serialisation."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast_tools.hist import Histogram

values = st.lists(st.floats(min_value=1e-6, max_value=1e3, allow_nan=False), min_size=1)


@given(st.floats(min_value=1e-9, max_value=1e9, allow_nan=False))
def test_single_value_relative_error_within_one_percent(v: float) -> None:
    """Any positive value comes back within 0.8% (1 / 2S for S = 64)."""
    h = Histogram()
    h.record(v * 1.3)  # a second value so the min/max clamp does not hide the bucket error
    h.record(v)
    assert abs(h.quantile(0.0) - v) / v <= 1 / 128 + 1e-12


def test_quantiles_match_exact_percentiles_within_one_percent() -> None:
    """p50/p90/p99/p99.9 of a wide lognormal sample are within 1% of the exact ones."""
    rng = random.Random(4)
    data = sorted(rng.lognormvariate(-3, 1.2) for _ in range(50_000))
    h = Histogram()
    h.record_many(data)
    for q in (0.5, 0.9, 0.99, 0.999):
        exact = data[math.ceil(q * len(data)) - 1]
        assert h.quantile(q) == pytest.approx(exact, rel=0.01)
    assert h.count == len(data) and h.mean == pytest.approx(sum(data) / len(data))


def test_zero_and_empty() -> None:
    """Zeros have their own bucket; an empty histogram answers nan."""
    h = Histogram()
    assert math.isnan(h.quantile(0.5))
    h.record(0.0)
    h.record(0.0)
    h.record(2.0)
    assert h.quantile(0.5) == 0.0 and h.quantile(1.0) == pytest.approx(2.0, rel=0.01)


@given(values, values)
def test_merge_equals_recording_everything_in_one(a: list[float], b: list[float]) -> None:
    """Merging two histograms gives the same buckets as one histogram of both."""
    ha, hb, both = Histogram(), Histogram(), Histogram()
    ha.record_many(a)
    hb.record_many(b)
    both.record_many(a + b)
    ha.merge(hb)
    assert ha.to_dict()["buckets"] == both.to_dict()["buckets"]
    assert ha.count == both.count and ha.min == both.min and ha.max == both.max


def test_merge_refuses_different_resolutions() -> None:
    """Histograms with different sub-bucket counts do not merge."""
    with pytest.raises(ValueError):
        Histogram(64).merge(Histogram(32))


@given(values)
def test_json_round_trip_preserves_quantiles(data: list[float]) -> None:
    """to_dict/from_dict survive JSON and keep every quantile."""
    h = Histogram()
    h.record_many(data)
    back = Histogram.from_dict(json.loads(json.dumps(h.to_dict())))
    for q in (0.0, 0.5, 0.99, 1.0):
        assert back.quantile(q) == h.quantile(q)


def test_percentiles_names_keys() -> None:
    """percentiles() names keys p50, p99.9 ..."""
    h = Histogram()
    h.record(1.0)
    assert set(h.percentiles([50, 99.9])) == {"p50", "p99.9"}
