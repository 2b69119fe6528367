"""No single client can open a breaker: the distinct-client rule and shared (connect) failures."""

from __future__ import annotations

import pytest

from ballast_asgi.core.breaker import Breaker, BreakerState
from ballast_asgi.core.breaker_stats import TripStats


def _breaker(**kw: int) -> Breaker:
    opts = {"consecutive_failures": 5, "min_calls": 10, "window_ms": 10_000, "open_ms": 1_000}
    opts.update(kw)
    return Breaker(**opts)


def _fail(b: Breaker, now: float, client: str | None, shared: bool = False) -> None:
    ticket = b.acquire(now)
    assert ticket is not None
    ticket.record(False, now, client=client, shared=shared)


def test_one_client_failing_forty_times_does_not_open_it() -> None:
    """40 failures in a row from one address: still closed (default min_failing_clients 3)."""
    b = _breaker()
    for i in range(40):
        _fail(b, i * 0.01, "10.0.0.1")
    assert b.state(1.0) is BreakerState.CLOSED
    assert b.snapshot(1.0)["failing_clients"] == 1


def test_two_clients_cannot_either_but_three_can() -> None:
    """Failures from 2 addresses stay closed; a third failing address opens it."""
    b = _breaker()
    for i in range(20):
        _fail(b, i * 0.01, f"10.0.0.{i % 2}")
    assert b.state(0.5) is BreakerState.CLOSED
    _fail(b, 0.5, "10.0.0.9")
    assert b.state(0.5) is BreakerState.OPEN


def test_connect_errors_count_whoever_sent_the_request() -> None:
    """Shared failures (connection refused) open it from one address, at consecutive_failures."""
    b = _breaker()
    for i in range(4):
        _fail(b, i * 0.01, "10.0.0.1", shared=True)
    assert b.state(0.1) is BreakerState.CLOSED
    _fail(b, 0.1, "10.0.0.1", shared=True)
    assert b.state(0.1) is BreakerState.OPEN


def test_client_failures_do_not_help_shared_ones_trip_by_count() -> None:
    """One client's 5xx interleaved with connect errors: only the shared ones count alone."""
    b = _breaker()
    for i in range(4):
        _fail(b, i * 0.01, "10.0.0.1", shared=True)
        _fail(b, i * 0.01, "10.0.0.1")
    assert b.state(0.1) is BreakerState.CLOSED
    _fail(b, 0.1, "10.0.0.1", shared=True)
    assert b.state(0.1) is BreakerState.OPEN


def test_failing_clients_leave_with_the_window() -> None:
    """Addresses whose failures are older than the window no longer count as distinct."""
    b = _breaker(consecutive_failures=1_000)
    _fail(b, 0.0, "a")
    _fail(b, 0.0, "b")
    for i in range(30):
        _fail(b, 20.0 + i * 0.01, "c")
    assert b.state(21.0) is BreakerState.CLOSED
    assert b.snapshot(21.0)["failing_clients"] == 1


def test_a_flood_of_invented_addresses_keeps_the_tracker_small() -> None:
    """10,000 distinct addresses: the tracker holds at most min_failing_clients of them."""
    stats = TripStats(
        window_ms=10_000, failure_ratio=0.5, min_calls=10**6,
        consecutive_failures=10**6, min_failing_clients=3,
    )  # fmt: skip
    for i in range(10_000):
        stats.record(False, 1.0, client=f"2001:db8::{i:x}")
    assert len(stats._clients) == 3
    assert stats.failing_clients(1.0) == 3


def test_a_success_resets_both_streaks() -> None:
    """A success between failures restarts the consecutive counts, shared ones too."""
    b = _breaker()
    for _ in range(4):
        _fail(b, 0.0, "x", shared=True)
    ticket = b.acquire(0.0)
    assert ticket is not None
    ticket.record(True, 0.0)
    for _ in range(4):
        _fail(b, 0.0, "x", shared=True)
    assert b.state(0.0) is BreakerState.CLOSED


def test_min_failing_clients_one_is_the_classic_breaker() -> None:
    """min_failing_clients=1: one address opens it at consecutive_failures."""
    b = _breaker(min_failing_clients=1)
    for _ in range(5):
        _fail(b, 0.0, "10.0.0.1")
    assert b.state(0.0) is BreakerState.OPEN


@pytest.mark.parametrize("statuses", [(404,), (500, 429)])
def test_4xx_can_never_be_a_failure_status(statuses: tuple[int, ...]) -> None:
    """A 4xx in failure_statuses is refused by the core, naming the parameter."""
    with pytest.raises(ValueError, match="failure_statuses"):
        Breaker(failure_statuses=statuses)


def _open(b: Breaker) -> None:
    """Open ``b`` with connect errors (shared) at t=0; open_ms is 1 s."""
    for _ in range(5):
        _fail(b, 0.0, "net", shared=True)
    assert b.state(0.0) is BreakerState.OPEN


def test_a_client_whose_probe_fails_cannot_keep_a_recovered_breaker_open() -> None:
    """Half-open: bad's failed probe does not reopen; bad is refused, good's probe closes it."""
    b = _breaker()
    _open(b)
    probe = b.acquire(1.5, "bad")
    assert probe is not None and probe.probe
    probe.record(False, 1.5, client="bad")
    assert b.state(1.5) is BreakerState.HALF_OPEN
    assert b.acquire(1.6, "bad") is None  # its own problem: refused until the state changes
    good = b.acquire(1.6, "good")
    assert good is not None and good.probe
    good.record(True, 1.6, client="good")
    assert b.state(1.6) is BreakerState.CLOSED
    assert b.acquire(1.7, "bad") is not None


def test_failed_probes_from_three_clients_reopen_it() -> None:
    """A real outage: probes of three distinct clients fail, the breaker reopens."""
    b = _breaker()
    _open(b)
    for i, client in enumerate(("a", "b", "c")):
        ticket = b.acquire(1.5 + i * 0.01, client)
        assert ticket is not None
        ticket.record(False, 1.5 + i * 0.01, client=client)
    assert b.state(1.6) is BreakerState.OPEN
    assert b.snapshot(1.6)["trips_in_a_row"] == 2


def test_a_shared_probe_failure_reopens_at_once() -> None:
    """A probe refused a connection reopens the breaker whoever sent it."""
    b = _breaker()
    _open(b)
    ticket = b.acquire(1.5, "a")
    assert ticket is not None
    ticket.record(False, 1.5, client="a", shared=True)
    assert b.state(1.5) is BreakerState.OPEN


def test_a_probe_that_times_out_counts_as_its_clients_failure() -> None:
    """A hung probe frees the slot after probe_timeout_ms; reopening needs three clients."""
    b = _breaker(probe_timeout_ms=100)
    _open(b)
    assert b.acquire(1.0, "slow") is not None
    assert b.state(1.2) is BreakerState.HALF_OPEN  # timed out: slot free, slow barred
    assert b.acquire(1.2, "slow") is None
    assert b.acquire(1.2, "x") is not None
    assert b.acquire(1.4, "y") is not None  # x's probe timed out at 1.3
    assert b.state(1.6) is BreakerState.OPEN  # y's at 1.5: three clients
