"""The breaker state machine on a fake clock (time is an argument)."""

from __future__ import annotations

import pytest

from ballast_asgi.config import BreakerConfig
from ballast_asgi.core.breaker import Breaker, BreakerState

CLOSED, OPEN, HALF = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


def _breaker(**kw: object) -> Breaker:
    opts: dict[str, object] = {
        "window_ms": 10_000,
        "failure_ratio": 0.5,
        "min_calls": 4,
        "consecutive_failures": 3,
        "open_ms": 1_000,
        "max_open_ms": 4_000,
        "probe_timeout_ms": 500,
        "min_failing_clients": 1,  # the classic rule; the client rule: test_breaker_clients.py
    }
    opts.update(kw)
    return Breaker(**opts)  # type: ignore[arg-type]


def _call(b: Breaker, success: bool, now: float) -> None:
    ticket = b.acquire(now)
    assert ticket is not None
    ticket.record(success, now)


def _trip(b: Breaker, now: float) -> None:
    for _ in range(b.consecutive_failures):
        _call(b, False, now)
    assert b.state(now) is OPEN


def test_starts_closed_and_success_keeps_it_closed() -> None:
    """A fresh breaker is closed and successes never open it."""
    b = _breaker()
    for i in range(100):
        _call(b, True, i * 0.01)
    assert b.state(1.0) is CLOSED
    assert b.transitions == {"closed": 0, "open": 0, "half_open": 0}


def test_consecutive_failures_trip() -> None:
    """N failures in a row open the breaker; a success in between resets the run."""
    b = _breaker(min_calls=1000, consecutive_failures=3)
    _call(b, False, 0.0)
    _call(b, False, 0.0)
    _call(b, True, 0.0)
    _call(b, False, 0.0)
    _call(b, False, 0.0)
    assert b.state(0.0) is CLOSED
    _call(b, False, 0.0)
    assert b.state(0.0) is OPEN


def test_failure_ratio_trips_only_with_min_calls() -> None:
    """The ratio rule needs at least min_calls calls in the window."""
    b = _breaker(min_calls=6, consecutive_failures=100, failure_ratio=0.5)
    for ok in (True, False, True, False, True):
        _call(b, ok, 0.0)
    assert b.state(0.0) is CLOSED  # 2/5 failures, and below min_calls
    _call(b, False, 0.1)
    assert b.state(0.1) is OPEN  # 3/6 = 0.5


def test_failure_ratio_window_slides() -> None:
    """Failures older than the window no longer count toward the ratio."""
    b = _breaker(window_ms=1_000, min_calls=4, consecutive_failures=100)
    for ok in (False, False, True):
        _call(b, ok, 0.0)
    for ok in (True, True, False):
        _call(b, ok, 5.0)
    assert b.state(5.0) is CLOSED  # 1/3 in the window; with the old calls it would be 3/6
    _call(b, False, 5.0)
    assert b.state(5.0) is OPEN  # 2/4 in the window


def test_4xx_is_not_a_failure_status() -> None:
    """Only the configured 5xx statuses are failures; 4xx are successes."""
    b = _breaker()
    assert b.is_failure_status(503)
    assert b.is_failure_status(500)
    assert not b.is_failure_status(404)
    assert not b.is_failure_status(429)
    assert not b.is_failure_status(200)


def test_open_sheds_with_remaining_time() -> None:
    """While open, acquire gives nothing and Retry-After is the remaining open time."""
    b = _breaker(open_ms=3_000, max_open_ms=10_000)
    _trip(b, 10.0)
    assert b.acquire(10.5) is None
    assert not b.can_acquire(10.5)
    assert b.retry_after_s(10.5) == pytest.approx(2.5)
    assert b.retry_after_s(12.9) == 1.0  # never below one second


def test_open_to_half_open_after_open_period() -> None:
    """The open period ends in half-open, dated when it was due."""
    b = _breaker(open_ms=1_000)
    _trip(b, 0.0)
    assert b.state(0.999) is OPEN
    assert b.state(1.5) is HALF
    assert b.seconds_in_state(1.5) == pytest.approx(0.5)


def test_half_open_probe_success_closes() -> None:
    """One successful probe closes the breaker (half_open_successes=1)."""
    b = _breaker()
    _trip(b, 0.0)
    probe = b.acquire(1.0)
    assert probe is not None and probe.probe
    probe.record(True, 1.1)
    assert b.state(1.1) is CLOSED
    assert b.transitions == {"closed": 1, "open": 1, "half_open": 1}


def test_half_open_probe_failure_reopens() -> None:
    """A failed probe reopens the breaker for a longer period."""
    b = _breaker(open_ms=1_000)
    _trip(b, 0.0)
    probe = b.acquire(1.0)
    assert probe is not None
    probe.record(False, 1.2)
    assert b.state(1.2) is OPEN
    assert b.retry_after_s(1.2) == pytest.approx(2.0)


def test_half_open_needs_k_successes() -> None:
    """With half_open_successes=3, three probes in a row must succeed, one at a time."""
    b = _breaker(half_open_successes=3)
    _trip(b, 0.0)
    for i in range(3):
        assert b.state(1.0 + i) is HALF
        probe = b.acquire(1.0 + i)
        assert probe is not None and probe.probe
        assert b.acquire(1.0 + i) is None
        probe.record(True, 1.0 + i)
    assert b.state(4.0) is CLOSED


def test_exactly_one_probe_with_many_callers() -> None:
    """Whatever the concurrency, half-open hands out a single probe."""
    b = _breaker()
    _trip(b, 0.0)
    tickets = [b.acquire(1.0) for _ in range(1000)]
    granted = [t for t in tickets if t is not None]
    assert len(granted) == 1 and granted[0].probe
    assert b.retry_after_s(1.0) == 1.0


def test_probe_timeout_reclaims_slot_and_reopens() -> None:
    """A probe whose result never arrives reopens the breaker; the breaker cannot stick."""
    b = _breaker(open_ms=1_000, probe_timeout_ms=500)
    _trip(b, 0.0)
    lost = b.acquire(1.0)
    assert lost is not None
    assert b.acquire(1.4) is None
    assert b.state(1.5) is OPEN  # reopened at 1.5 for 2 s (second trip)
    assert b.state(3.49) is OPEN
    assert b.state(3.5) is HALF
    lost.record(True, 3.6)  # too late: ignored
    assert b.state(3.6) is HALF
    fresh = b.acquire(3.6)
    assert fresh is not None and fresh.probe


def test_cancelled_probe_frees_the_slot() -> None:
    """A probe cancelled without a result lets the next caller probe."""
    b = _breaker()
    _trip(b, 0.0)
    probe = b.acquire(1.0)
    assert probe is not None
    probe.cancel()
    assert b.state(1.0) is HALF
    assert b.acquire(1.0) is not None


def test_open_period_doubles_up_to_cap_and_resets_on_close() -> None:
    """Repeated trips double the open period up to max_open_ms; a close resets it."""
    b = _breaker(open_ms=1_000, max_open_ms=4_000)
    _trip(b, 0.0)
    now, periods = 0.0, []
    for _ in range(4):
        periods.append(b.retry_after_s(now))
        now += periods[-1]
        probe = b.acquire(now)
        assert probe is not None
        probe.record(False, now)
    assert periods == [1.0, 2.0, 4.0, 4.0]
    now += 4.0
    probe = b.acquire(now)
    assert probe is not None
    probe.record(True, now)
    _trip(b, now)
    assert b.retry_after_s(now) == 1.0


def test_stale_closed_tickets_are_ignored() -> None:
    """Results of tickets issued before a transition do not move the new state."""
    b = _breaker()
    old = [b.acquire(0.0) for _ in range(5)]
    _trip(b, 0.0)
    probe = b.acquire(1.0)
    assert probe is not None
    for t in old:
        assert t is not None
        t.record(False, 1.0)
    assert b.state(1.0) is HALF
    probe.record(True, 1.0)
    assert b.state(1.0) is CLOSED


def test_ticket_settles_once() -> None:
    """Recording or cancelling a ticket twice is a bug and raises."""
    b = _breaker()
    ticket = b.acquire(0.0)
    assert ticket is not None
    ticket.record(True, 0.0)
    assert ticket.settled
    with pytest.raises(RuntimeError):
        ticket.record(True, 0.0)
    with pytest.raises(RuntimeError):
        ticket.cancel()


def test_listener_sees_every_transition() -> None:
    """The transition listener is called with old state, new state and time."""
    b = _breaker(open_ms=1_000)
    seen: list[tuple[str, str, float]] = []
    b.set_on_transition(lambda old, new, at: seen.append((old.value, new.value, at)))
    _trip(b, 0.0)
    probe = b.acquire(2.0)
    assert probe is not None
    probe.record(True, 2.0)
    assert seen == [
        ("closed", "open", 0.0),
        ("open", "half_open", 1.0),
        ("half_open", "closed", 2.0),
    ]


def test_disabled_breaker_never_opens() -> None:
    """enabled=False always hands out tickets."""
    b = _breaker(enabled=False)
    for _ in range(100):
        _call(b, False, 0.0)
    assert b.state(0.0) is CLOSED


def test_snapshot_is_json_safe() -> None:
    """The snapshot carries state, time in state and transitions."""
    b = _breaker()
    _trip(b, 0.0)
    snap = b.snapshot(0.25)
    assert snap["state"] == "open"
    assert snap["seconds_in_state"] == 0.25
    assert snap["open_remaining_s"] == 0.75
    assert snap["transitions"]["open"] == 1
    assert set(snap) >= {"state", "seconds_in_state", "transitions", "probe_in_flight"}


def test_from_config_uses_the_defaults() -> None:
    """from_config maps every BreakerConfig field."""
    b = Breaker.from_config(BreakerConfig(open_ms=2_000, failure_statuses=(503,)))
    assert b.open_s == 2.0 and b.min_calls == 20 and b.consecutive_failures == 10
    assert b.is_failure_status(503) and not b.is_failure_status(500)


@pytest.mark.parametrize(
    ("field", "value"),
    [("failure_ratio", 0.0), ("min_calls", 0), ("open_ms", 0), ("probe_timeout_ms", 0)],
)
def test_validation_names_the_field(field: str, value: float) -> None:
    """A bad setting raises ValueError naming the field."""
    with pytest.raises(ValueError, match=field):
        _breaker(**{field: value})
