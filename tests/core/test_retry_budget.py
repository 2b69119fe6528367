"""The retry budget: ratio of originals plus a floor, over a bucketed sliding window."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast_asgi.config import RetryConfig
from ballast_asgi.core.retry_budget import RetryBudget, WindowCounts

# 10 s window in 10 buckets of 1 s; test times are multiples of 1/4 s, so the
# bucket arithmetic is exact in binary floating point.
WINDOW_S = 10.0
BUCKET_S = 1.0


def test_floor_lets_a_quiet_service_retry() -> None:
    """With no originals at all, the floor (min_retries_per_s * window) still grants retries."""
    b = RetryBudget(budget_ratio=0.1, window_ms=10_000, min_retries_per_s=0.5)
    assert b.floor == 5.0
    granted = sum(b.try_acquire_retry(1.0) for _ in range(20))
    assert granted == 5


def test_ratio_of_originals() -> None:
    """100 originals at 10% give 10 retries on top of the floor."""
    b = RetryBudget(budget_ratio=0.1, window_ms=10_000, min_retries_per_s=0.0)
    for _ in range(100):
        b.record_original(0.0)
    assert b.balance(0.0) == pytest.approx(10.0)
    granted = sum(b.try_acquire_retry(0.5) for _ in range(50))
    assert granted == 10
    assert b.balance(0.5) == 0.0


def test_window_slides_and_refills() -> None:
    """Originals and retries leave the window; the allowance follows the recent originals."""
    b = RetryBudget(budget_ratio=0.5, window_ms=10_000, min_retries_per_s=0.0)
    for _ in range(10):
        b.record_original(0.0)
    assert sum(b.try_acquire_retry(0.0) for _ in range(10)) == 5
    assert not b.try_acquire_retry(9.9)
    assert not b.try_acquire_retry(10.0)  # originals at 0 are gone, and nothing new came
    b.record_original(10.0)
    b.record_original(10.0)
    assert b.try_acquire_retry(10.5)
    assert not b.try_acquire_retry(10.5)


def test_failures_rising_do_not_grow_the_allowance() -> None:
    """Retries never feed the budget: only originals do."""
    b = RetryBudget(budget_ratio=0.1, window_ms=10_000, min_retries_per_s=0.0)
    for i in range(1000):
        b.record_original(i * 0.005)
    asked = granted = 0
    for i in range(1000):
        asked += 1
        granted += b.try_acquire_retry(5.0 + i * 0.001)
    assert granted == 100 and asked == 1000


def test_snapshot_reports_balance_and_counts() -> None:
    """The snapshot has the balance, the window contents and lifetime totals."""
    b = RetryBudget(budget_ratio=0.1, window_ms=10_000, min_retries_per_s=1.0)
    for _ in range(50):
        b.record_original(0.0)
    b.try_acquire_retry(0.0)
    snap = b.snapshot(0.0)
    assert snap["balance"] == pytest.approx(14.0)
    assert snap["originals_in_window"] == 50
    assert snap["retries_in_window"] == 1
    assert snap["retries_granted_total"] == 1
    assert snap["floor"] == 10.0


def test_from_config() -> None:
    """from_config maps ratio, window and floor."""
    b = RetryBudget.from_config(RetryConfig(budget_ratio=0.2, window_ms=5_000, min_retries_per_s=2))
    assert (b.budget_ratio, b.window_s, b.floor) == (0.2, 5.0, 10.0)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"budget_ratio": 1.5}, "budget_ratio"),
        ({"window_ms": 0}, "window_ms"),
        ({"min_retries_per_s": -1.0}, "min_retries_per_s"),
    ],
)
def test_validation_names_the_field(kwargs: dict[str, float], field: str) -> None:
    """Bad settings raise ValueError naming the field."""
    with pytest.raises(ValueError, match=field):
        RetryBudget(**kwargs)  # type: ignore[arg-type]


def test_memory_is_bounded() -> None:
    """However many events, the window keeps one slot per bucket."""
    w = WindowCounts(10.0, buckets=10, kinds=2)
    for i in range(100_000):
        w.add(i * 0.01, i % 2)
    assert len(w._epochs) == 10
    assert w.total(999.99, 0) + w.total(999.99, 1) == 1000


def test_clock_never_runs_backwards() -> None:
    """An older timestamp is counted as the newest time seen, never resurrecting a bucket."""
    w = WindowCounts(10.0, buckets=10, kinds=1)
    w.add(100.0, 0)
    w.add(50.0, 0)
    assert w.total(100.0, 0) == 2


# -- properties ---------------------------------------------------------------

_event = st.tuples(st.integers(min_value=0, max_value=20), st.booleans(), st.integers(1, 5))


def _run(
    ratio: float, min_per_s: float, events: list[tuple[int, bool, int]]
) -> tuple[RetryBudget, list[float], list[float]]:
    """Play (quarter-seconds later, is_original, count) events; return the granted times."""
    budget = RetryBudget(budget_ratio=ratio, window_ms=10_000, min_retries_per_s=min_per_s)
    originals: list[float] = []
    granted: list[float] = []
    now = 0.0
    for quarters, is_original, count in events:
        now += quarters / 4
        for _ in range(count):
            if is_original:
                budget.record_original(now)
                originals.append(now)
            elif budget.try_acquire_retry(now):
                granted.append(now)
    return budget, originals, granted


def _count(times: list[float], lo: float, hi: float, lo_open: bool = True) -> int:
    return sum(1 for t in times if (t > lo if lo_open else t >= lo) and t <= hi)


_ratios = st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0])
_floors = st.sampled_from([0.0, 0.25, 1.0])


@settings(max_examples=300, deadline=None)
@given(_ratios, _floors, st.lists(_event, max_size=120))
def test_retries_at_each_grant_stay_within_ratio_plus_floor(
    ratio: float, min_per_s: float, events: list[tuple[int, bool, int]]
) -> None:
    """At every grant t: retries in (t-W+b, t] <= ratio * originals in (t-W, t] + floor."""
    budget, originals, granted = _run(ratio, min_per_s, events)
    for t in granted:
        retries = _count(granted, t - (WINDOW_S - BUCKET_S), t)
        allowed = ratio * _count(originals, t - WINDOW_S, t) + budget.floor
        assert retries <= allowed


@settings(max_examples=300, deadline=None)
@given(_ratios, _floors, st.lists(_event, max_size=120))
def test_retries_in_any_interval_are_bounded(
    ratio: float, min_per_s: float, events: list[tuple[int, bool, int]]
) -> None:
    """Any interval of length L holds at most ratio * originals + floor * (L // (W-b) + 1).

    The originals counted are those in the interval and the window before it: a
    retry is paid for by originals seen recently, and cannot be revoked later.
    """
    budget, originals, granted = _run(ratio, min_per_s, events)
    points = sorted(set(granted))
    for i, start in enumerate(points):
        for end in points[i:]:
            retries = _count(granted, start, end, lo_open=False)
            windows = math.floor((end - start) / (WINDOW_S - BUCKET_S)) + 1
            paid = ratio * _count(originals, start - WINDOW_S, end)
            assert retries <= paid + budget.floor * windows + 1e-9


@settings(max_examples=100, deadline=None)
@given(_ratios, st.lists(_event, max_size=120))
def test_balance_matches_what_can_be_taken(
    ratio: float, events: list[tuple[int, bool, int]]
) -> None:
    """After any history, exactly floor(balance) more retries can be taken at once."""
    budget, _, _ = _run(ratio, 1.0, events)
    now = sum(q for q, _, _ in events) / 4
    expect = math.floor(budget.balance(now) + 1e-9)
    taken = 0
    while budget.try_acquire_retry(now):
        taken += 1
    assert taken == expect


class _ReferenceWindow:
    """The ring as first written (every ``add`` recomputes its bucket): the model."""

    def __init__(self, window_s: float, buckets: int, kinds: int) -> None:
        self.per_s, self.n, self.latest = buckets / window_s, buckets, -(2**62)
        self.epochs = [-(2**62)] * buckets
        self.values = [[0] * buckets for _ in range(kinds)]

    def epoch(self, now: float) -> int:
        self.latest = max(self.latest, math.floor(now * self.per_s))
        return self.latest

    def add(self, now: float, kind: int) -> None:
        epoch = self.epoch(now)
        slot = epoch % self.n
        if self.epochs[slot] != epoch:
            self.epochs[slot] = epoch
            for values in self.values:
                values[slot] = 0
        self.values[kind][slot] += 1

    def total(self, now: float, kind: int) -> int:
        oldest = self.epoch(now) - self.n + 1
        return sum(v for v, e in zip(self.values[kind], self.epochs, strict=True) if e >= oldest)

    def clear(self) -> None:
        self.epochs = [-(2**62)] * self.n
        self.values = [[0] * self.n for _ in self.values]


_op = st.tuples(
    st.sampled_from(["add", "add", "add", "total", "clear"]),
    st.integers(min_value=-8, max_value=40),  # time in eighths of a bucket: may go back
    st.integers(min_value=0, max_value=1),
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 3, 10]), st.lists(_op, max_size=150))
def test_window_counts_match_the_reference_ring(
    buckets: int, ops: list[tuple[str, int, int]]
) -> None:
    """``add``'s shortcut within the newest bucket counts exactly as recomputing each time,
    whatever the order of adds, totals, clears and times that run backwards."""
    window = WindowCounts(float(buckets), buckets=buckets, kinds=2)
    model = _ReferenceWindow(float(buckets), buckets, 2)
    for op, eighths, kind in ops:
        now = 100.0 + eighths / 8
        if op == "add":
            window.add(now, kind)
            model.add(now, kind)
        elif op == "clear":
            window.clear()
            model.clear()
        else:
            assert window.total(now, kind) == model.total(now, kind)
    for kind in (0, 1):
        assert window.total(110.0, kind) == model.total(110.0, kind)
        assert window.total(100.0, kind) == model.total(100.0, kind)


def test_a_refunded_retry_is_no_longer_counted() -> None:
    """A granted retry that never ran gives its place back, in the bucket it was counted in."""
    budget = RetryBudget(budget_ratio=0.0, window_ms=10_000, min_retries_per_s=0.2)  # floor 2
    assert budget.try_acquire_retry(0.5) and budget.try_acquire_retry(1.5)
    assert not budget.try_acquire_retry(2.0)
    assert budget.refund_retry(0.5)  # its bucket (0-1 s) is still in the window
    assert budget.balance(2.0) == 1.0 and budget.try_acquire_retry(2.0)
    snap = budget.snapshot(2.0)
    assert snap["retries_in_window"] == 2 and snap["retries_refunded_total"] == 1
    assert snap["retries_granted_total"] == 3


def test_a_refund_never_takes_from_another_bucket_or_below_zero() -> None:
    """A grant whose bucket left the window, or a bucket with nothing in it: no change."""
    budget = RetryBudget(budget_ratio=0.0, window_ms=10_000, min_retries_per_s=0.2)
    assert budget.try_acquire_retry(0.5)
    assert budget.try_acquire_retry(10.5)  # the 0-1 s bucket's slot now holds 10-11 s
    assert not budget.refund_retry(0.5)  # that grant's bucket is gone: it counts no more
    assert budget.snapshot(10.5)["retries_in_window"] == 1
    assert budget.refund_retry(10.5) and not budget.refund_retry(10.5)  # never below zero
    assert budget.snapshot(10.5)["retries_in_window"] == 0
    assert budget.snapshot(10.5)["retries_refunded_total"] == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 0.9), st.booleans()), min_size=1, max_size=40))
def test_refunds_match_grants_not_refunded(steps: list[tuple[float, bool]]) -> None:
    """After any grants and refunds, the window counts exactly the grants not given back."""
    budget = RetryBudget(budget_ratio=0.0, window_ms=100_000, min_retries_per_s=1.0)
    now, kept = 0.0, 0
    for gap, refund in steps:
        now += gap
        assert budget.try_acquire_retry(now)
        if refund:
            assert budget.refund_retry(now)
        else:
            kept += 1
    assert budget.snapshot(now)["retries_in_window"] == kept
