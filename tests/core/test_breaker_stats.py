"""The closed breaker's statistics and trip rule (``core/breaker_stats.py``), driven by ``now``."""

from __future__ import annotations

import pytest

from ballast_asgi.core.breaker_stats import TripStats


def _stats(**kw: float) -> TripStats:
    params: dict[str, float] = {
        "window_ms": 10_000,
        "failure_ratio": 0.5,
        "min_calls": 4,
        "consecutive_failures": 3,
    }
    params.update(kw)
    return TripStats(**params)  # type: ignore[arg-type]


def test_a_streak_of_failures_trips_and_a_success_resets_it() -> None:
    """consecutive_failures in a row trip; a success in between starts the count again."""
    stats = _stats(min_calls=1_000)
    assert [stats.record(False, 0.0), stats.record(False, 0.1)] == [False, False]
    assert stats.record(True, 0.2) is False and stats.consecutive == 0
    assert [stats.record(False, 0.3) for _ in range(3)] == [False, False, True]


def test_the_ratio_trips_only_from_min_calls_on() -> None:
    """Half failures trip once min_calls calls are in the window, not before."""
    stats = _stats(consecutive_failures=1_000)
    assert [stats.record(ok, 1.0) for ok in (False, True, False)] == [False, False, False]
    assert stats.record(True, 1.0) is False  # 2 of 4 failed, but the last call succeeded
    assert stats.record(False, 1.0) is True  # 3 of 5 failed: at least half


def test_old_calls_leave_the_window_and_clear_forgets_all() -> None:
    """Calls older than the window no longer count; clear() empties window and streak."""
    stats = _stats(consecutive_failures=1_000)
    for _ in range(3):
        stats.record(False, 0.0)
    assert stats.snapshot(0.0) == {
        "window_calls": 3,
        "window_failures": 3,
        "window_shared_failures": 0,
        "consecutive_failures": 3,
        "failing_clients": 1,
        "min_failing_clients": 1,
    }
    assert stats.snapshot(20.0)["window_calls"] == 0
    stats.clear()
    assert stats.snapshot(0.0)["consecutive_failures"] == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("window_ms", 0),
        ("failure_ratio", 0.0),
        ("min_calls", 0),
        ("consecutive_failures", 0),
        ("min_failing_clients", 0),
    ],
)
def test_bad_parameters_are_refused_naming_the_field(field: str, value: float) -> None:
    """Each trip parameter is checked by the core, naming it."""
    with pytest.raises(ValueError, match=f"breaker {field} must be"):
        _stats(**{field: value})
