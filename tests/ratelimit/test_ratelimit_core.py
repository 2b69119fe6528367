"""Pure rate-limit cores: GCRA against a reference bucket, key table, breakers, bookkeeping."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ballast_asgi.ratelimit.core import gcra
from ballast_asgi.ratelimit.core.accounting import (
    ChargeBook,
    RateEstimate,
    demand_share,
    lease_size,
)
from ballast_asgi.ratelimit.core.breaker import CLOSED, HALF_OPEN, OPEN, NaiveBreaker, RedisBreaker
from ballast_asgi.ratelimit.core.gcra import Limits, ReferenceBucket
from ballast_asgi.ratelimit.core.table import KeyTable

ROOT = Path(__file__).resolve().parents[2]


def _replay(limits: Limits, gaps: list[float]) -> tuple[list[bool], list[bool]]:
    tat, now = 0.0, 0.0
    ref = ReferenceBucket(limits, 0.0)
    ours, theirs = [], []
    for gap in gaps:
        now += gap
        decision, tat = gcra.decide(tat, now, limits)
        ours.append(decision.allowed)
        theirs.append(ref.take(now))
    return ours, theirs


@settings(max_examples=200, deadline=None)
@given(
    rate=st.sampled_from([1.0, 7.0, 100.0, 1000.0]),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0.0, 0.05).map(lambda g: round(g, 6)), min_size=1, max_size=300),
)
def test_gcra_matches_the_reference_bucket(rate: float, burst: int, gaps: list[float]) -> None:
    """GCRA admits exactly the requests a float token bucket admits, on any arrival sequence."""
    ours, theirs = _replay(Limits(rate, burst), gaps)
    assert ours == theirs


def test_gcra_burst_then_rate() -> None:
    """A fresh key admits `burst` at once, then one per interval."""
    limits = Limits(10.0, 3)
    tat = 0.0
    allowed = []
    for _ in range(5):
        d, tat = gcra.decide(tat, 1.0, limits)
        allowed.append(d.allowed)
    assert allowed == [True, True, True, False, False]
    d, tat = gcra.decide(tat, 1.1, limits)
    assert d.allowed


def test_retry_after_is_exactly_the_refill_time() -> None:
    """A denied request is admitted at now + retry_after and not a moment before."""
    limits = Limits(4.0, 2)
    tat = 0.0
    for _ in range(2):
        _, tat = gcra.decide(tat, 5.0, limits)
    denied, _ = gcra.decide(tat, 5.0, limits)
    assert not denied.allowed and denied.retry_after_s == pytest.approx(0.25)
    early, _ = gcra.decide(tat, 5.0 + denied.retry_after_s - 1e-4, limits)
    late, _ = gcra.decide(tat, 5.0 + denied.retry_after_s, limits)
    assert (early.allowed, late.allowed) == (False, True)
    assert denied.remaining == 0


def test_take_give_back_and_charge() -> None:
    """Leases take whole tokens, give-back never overfills, charge lapses once refilled."""
    limits = Limits(10.0, 5)
    granted, tat = gcra.take_up_to(0.0, 1.0, limits, 8)
    assert granted == 5 and tat == pytest.approx(1.5)
    assert gcra.take_up_to(tat, 1.0, limits, 3)[0] == 0
    assert gcra.give_back(tat, 1.0, limits, 2) == pytest.approx(1.3)
    assert gcra.give_back(tat, 1.0, limits, 50) == 1.0
    assert gcra.charge(1.0, 2.0, limits, 3, since=1.9) == pytest.approx(2.2)
    assert gcra.charge(1.0, 10.0, limits, 3, since=5.0) == pytest.approx(5.3)
    assert gcra.charge(6.0, 10.0, limits, 0, since=5.0) == 6.0


def test_limits_validate_and_scale() -> None:
    """Limits reject nonsense; a share keeps the burst at least one."""
    with pytest.raises(ValueError, match="rate_per_s"):
        Limits(0.0, 1)
    with pytest.raises(ValueError, match="burst"):
        Limits(1.0, 0)
    half = Limits(1000.0, 100).scaled(0.5)
    assert (half.rate_per_s, half.burst) == (500.0, 50)
    assert Limits(10.0, 1).scaled(0.1).burst == 1


def test_key_table_stays_bounded_under_zipf_keys() -> None:
    """10,000 Zipf-distributed keys never hold more than max_keys entries or ~200 KB."""
    rng = random.Random(7)
    weights = [1 / (i + 1) ** 1.1 for i in range(10_000)]
    keys = [f"tenant-{i}" for i in rng.choices(range(10_000), weights, k=30_000)]
    table: KeyTable[float] = KeyTable(1_000, lambda tat, now: tat > now)
    limits = Limits(5.0, 5)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i, key in enumerate(keys):
        now = i * 0.0005
        tat = table.get(key)
        _, new = gcra.decide(now if tat is None else tat, now, limits)
        table.put(key, new, now)
        assert len(table) <= 1_000
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert used < 200_000
    snap = table.snapshot()
    assert snap["evicted"] > 0 and snap["evicted_with_debt"] <= snap["evicted"]


def test_key_table_evicts_least_recently_used() -> None:
    """A key read recently survives; the oldest untouched key goes."""
    table: KeyTable[float] = KeyTable(2, lambda v, now: v > now)
    table.put("a", 5.0, 0.0)
    table.put("b", 0.0, 0.0)
    assert table.get("a") == 5.0
    table.put("c", 0.0, 1.0)
    assert "b" not in table and "a" in table
    table.put("d", 0.0, 1.0)
    assert table.evicted == 2 and table.evicted_with_debt == 1


def test_rebuilt_breaker_opens_on_half_failed_and_five() -> None:
    """Five failures that are half the calls in 100 ms open it; four do not."""
    b = RedisBreaker()
    for i in range(4):
        b.record(False, 0.01 * i)
    assert b.state(0.05) == CLOSED
    b.record(False, 0.05)
    assert b.state(0.05) == OPEN and not b.allow(0.1)


def test_rebuilt_breaker_ignores_a_minority_of_failures() -> None:
    """Five failures among eleven calls (< 50 %) keep it closed."""
    b = RedisBreaker()
    for i in range(6):
        b.record(True, 0.001 * i)
    for i in range(5):
        b.record(False, 0.01 + 0.001 * i)
    assert b.state(0.02) == CLOSED


def test_rebuilt_breaker_forgets_old_failures() -> None:
    """Failures older than the window do not count toward opening."""
    b = RedisBreaker()
    for i in range(4):
        b.record(False, 0.001 * i)
    b.record(False, 0.2)
    assert b.state(0.2) == CLOSED


def test_rebuilt_breaker_half_open_lets_one_probe() -> None:
    """After 100 ms exactly one call goes; success closes, failure opens again."""
    b = RedisBreaker()
    for _ in range(5):
        b.record(False, 0.0)
    assert not b.allow(0.099) and b.refusing(0.099)
    assert b.state(0.1) == HALF_OPEN and not b.refusing(0.1)  # asking does not claim the probe
    assert b.allow(0.1) and b.refusing(0.1) and not b.allow(0.1)
    b.record(False, 0.11)
    assert b.state(0.11) == OPEN
    assert b.allow(0.22)
    b.record(True, 0.23)
    assert b.state(0.23) == CLOSED and b.allow(0.23)


def test_naive_breaker_three_misses_pause_for_a_second() -> None:
    """Three misses in a row stop calls for 1 s; a success resets the streak."""
    b = NaiveBreaker()
    b.record(False, 0.0)
    b.record(False, 0.0)
    b.record(True, 0.0)
    b.record(False, 0.0)
    assert b.allow(0.0)
    b.record(False, 0.0)
    b.record(False, 0.0)
    assert not b.allow(0.5) and b.state(0.5) == OPEN and b.refusing(0.5)
    assert b.allow(1.0) and b.state(1.0) == CLOSED and not b.refusing(1.0)


def test_charge_book_drains_lapses_and_restores() -> None:
    """Charges aggregate per key, lapse past max age, and come back after a failed flush."""
    book = ChargeBook(max_keys=2)
    book.add("a", 1.0, 0.01)
    book.add("a", 1.5, 0.01)
    book.add("b", 0.0, 0.01)
    items = book.drain(2.0, max_age_s=1.5)
    assert items == [("a", 2, 1.0, 0.01)] and book.dropped == 1 and len(book) == 0
    book.restore(items, 2.0)
    assert book.drain(2.0, 5.0) == [("a", 2, 1.0, 0.01)]
    for key in "xyz":
        book.add(key, 0.0, 0.01)
    assert len(book) == 2 and book.dropped == 2
    assert book.cancel("z") and not book.cancel("z") and not book.cancel("nope")
    assert len(book) == 1


def test_rate_estimate_follows_a_steady_rate() -> None:
    """1,000 events/s read as about 1,000/s and decay when they stop."""
    est = RateEstimate(0.5)
    for i in range(5_000):
        est.add(i / 1000)
    assert est.rate(5.0) == pytest.approx(1000, rel=0.01)
    assert est.rate(6.0) < 150
    with pytest.raises(ValueError):
        RateEstimate(0)


def test_rate_estimate_is_right_from_the_start() -> None:
    """After 0.2 s of a steady 500/s a fresh estimate already reads about 500/s."""
    est = RateEstimate(0.5)
    assert est.rate(0.0) == 0.0
    for i in range(100):
        est.add(i / 500)
    assert est.rate(0.2) == pytest.approx(500, rel=0.05)


def test_rate_estimate_is_not_known_before_it_has_history() -> None:
    """10 ms of a steady 750/s reads far too low, so it is not ``known``; 0.1 s is."""
    est = RateEstimate(0.5)
    assert not est.known(0.0)
    for i in range(1, 9):
        est.add(i / 750)
    assert not est.known(0.01) and est.rate(0.01) < 300
    for i in range(9, 76):
        est.add(i / 750)
    assert est.known(0.1 + 1 / 750)
    assert est.rate(0.1 + 1 / 750) == pytest.approx(750, rel=0.05)


def test_rate_estimate_starts_a_new_history_after_a_long_gap() -> None:
    """A key that comes back after 5 tau of silence reads its new rate at once, not a ramp."""
    est = RateEstimate(0.5)
    for i in range(500):
        est.add(i / 500)
    for i in range(100):
        est.add(10.0 + i / 500)
    assert est.known(10.2) and est.rate(10.2) == pytest.approx(500, rel=0.05)
    assert not est.known(10.05)


def test_lease_size_and_demand_share() -> None:
    """Lease sizes clamp; sync shares add up to the whole limit in both regimes."""
    assert lease_size(400.0, 0.1, 1, 50) == 40
    assert lease_size(0.0, 0.1, 2, 50) == 2
    assert lease_size(9_000.0, 0.1, 1, 50) == 50
    under = demand_share(300, 500, 2, 1000) + demand_share(200, 500, 2, 1000)
    over = demand_share(1350, 1500, 2, 1000) + demand_share(150, 1500, 2, 1000)
    assert under == pytest.approx(1.0) and over == pytest.approx(1.0)
    assert demand_share(0, 0, 4, 1000) == 0.25


def test_sync_share_holds_room_for_peers_that_have_not_published() -> None:
    """The first of two gateways to sync a new key gets half the limit, not all of it."""
    assert demand_share(750, 750, 2, 1000) == 0.875  # the silent peer counted as offering nothing
    assert demand_share(750, 750, 2, 1000, published=1) == pytest.approx(0.5)
    assert demand_share(300, 300, 2, 1000, published=1) == pytest.approx(0.5)
    assert demand_share(300, 900, 3, 1000, published=3) == pytest.approx((300 + 100 / 3) / 1000)
