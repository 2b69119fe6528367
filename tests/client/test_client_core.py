"""The client's pure cores: throttle rule, per-host state, retry decisions, backoff, config."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast_asgi.client.core.config import ClientConfig
from ballast_asgi.client.core.hosts import OTHER, HostTable
from ballast_asgi.client.core.policy import (
    Verdict,
    backoff_s,
    classify_status,
    may_retry,
    retry_after_s,
)
from ballast_asgi.client.core.throttle import AdaptiveThrottle
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.priority import Priority


def _feed(throttle: AdaptiveThrottle, requests: int, accepts: int, now: float = 0.0) -> None:
    rng = random.Random(0)
    for i in range(requests):
        throttle.admit(now, rng)
        if i < accepts:
            throttle.record_accept(now)


def test_reject_probability_is_the_sre_formula() -> None:
    """p = (requests - K*accepts) / (requests + 1) once the window holds enough requests."""
    t = AdaptiveThrottle(k=2.0, window_ms=10_000, min_requests=10)
    _feed(t, requests=100, accepts=20)
    assert t.reject_probability(0.0) == pytest.approx((100 - 40) / 101)


def test_no_rejection_while_half_are_accepted() -> None:
    """With K = 2 the probability is 0 while at least half the requests are accepted."""
    t = AdaptiveThrottle(k=2.0, min_requests=0)
    _feed(t, requests=100, accepts=50)
    assert t.reject_probability(0.0) == 0.0


def test_no_rejection_below_min_requests() -> None:
    """A window with fewer than min_requests requests refuses nothing, even with no accepts."""
    t = AdaptiveThrottle(min_requests=10)
    _feed(t, requests=9, accepts=0)
    assert t.reject_probability(0.0) == 0.0
    _feed(t, requests=1, accepts=0)
    assert t.reject_probability(0.0) == pytest.approx(10 / 11)


def test_window_forgets_old_requests() -> None:
    """Counts older than the window no longer throttle (recovery after the trigger)."""
    t = AdaptiveThrottle(window_ms=1_000, min_requests=0)
    _feed(t, requests=50, accepts=0, now=0.0)
    assert t.reject_probability(0.5) > 0.9
    assert t.reject_probability(2.0) == 0.0


class _FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_admit_refuses_with_probability_p() -> None:
    """A call is refused exactly when the injected draw falls below p (and is still counted)."""
    t = AdaptiveThrottle(k=2.0, min_requests=0)
    _feed(t, requests=99, accepts=0)  # p = 99 / 100
    assert not t.admit(0.0, _FixedRandom(0.98))
    assert t.admit(0.0, _FixedRandom(0.995))
    assert t.requests(0.0) == 101


@given(st.integers(0, 500), st.integers(0, 500))
def test_probability_bounds(requests: int, accepts: int) -> None:
    """The reject probability is always in [0, 1)."""
    t = AdaptiveThrottle(min_requests=0)
    _feed(t, requests=requests, accepts=min(accepts, requests))
    assert 0.0 <= t.reject_probability(0.0) < 1.0


@pytest.mark.parametrize(
    ("status", "reason", "verdict"),
    [
        (200, False, Verdict.OK),
        (404, False, Verdict.OK),
        (500, False, Verdict.OK),
        (429, False, Verdict.SHED),
        (429, True, Verdict.SHED),
        (503, True, Verdict.SHED),
        (502, False, Verdict.RETRYABLE),
        (503, False, Verdict.RETRYABLE),
        (504, False, Verdict.RETRYABLE),
        (504, True, Verdict.SHED),
    ],
)
def test_status_verdicts(status: int, reason: bool, verdict: Verdict) -> None:
    """Each status / X-Ballast-Reason pair gets the verdict of the policy table."""
    assert classify_status(status, reason) is verdict


@pytest.mark.parametrize(
    ("method", "verdict", "replayable", "retry"),
    [
        ("GET", Verdict.RETRYABLE, True, True),
        ("get", Verdict.CONNECT, True, True),
        ("PUT", Verdict.RETRYABLE, True, True),
        ("DELETE", Verdict.CONNECT, True, True),
        ("POST", Verdict.RETRYABLE, True, False),
        ("POST", Verdict.CONNECT, True, False),
        ("PATCH", Verdict.RETRYABLE, True, False),
        ("GET", Verdict.SHED, True, False),
        ("GET", Verdict.OK, True, False),
        ("GET", Verdict.FAILED, True, False),
        ("GET", Verdict.RETRYABLE, False, False),
    ],
)
def test_retry_decision_table(method: str, verdict: Verdict, replayable: bool, retry: bool) -> None:
    """Only idempotent, replayable calls after a connect error or a 502/503/504 are retried."""
    assert may_retry(method, verdict, replayable) is retry


@given(st.integers(1, 80), st.integers(0, 2**32))
def test_backoff_bounds(retry: int, seed: int) -> None:
    """Backoff is in [0, min(max, base * 2**(n-1))]."""
    delay = backoff_s(retry, random.Random(seed), 0.025, 1.0)
    assert 0.0 <= delay <= min(1.0, 0.025 * 2 ** (retry - 1))


def test_backoff_rejects_retry_zero() -> None:
    """Retry numbers start at 1."""
    with pytest.raises(ValueError, match="retry must be >= 1"):
        backoff_s(0, random.Random(0), 0.025, 1.0)


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("3", 3.0), (" 2.5 ", 2.5), (None, 1.0), ("soon", 1.0), ("-4", 0.0), ("9999", 30.0),
     ("nan", 1.0), ("inf", 1.0), ("Wed, 21 Oct 2015 07:28:00 GMT", 1.0), ("\u00e9", 1.0)],
)  # fmt: skip
def test_retry_after_parsing(raw: str | None, seconds: float) -> None:
    """Retry-After is delta-seconds cut to [0, cap]; missing or unreadable reads as 1 s."""
    assert retry_after_s(raw, 30.0) == seconds


def test_shed_blocks_its_tier_and_less_important_ones() -> None:
    """A standard-tier shed blocks standard and bulk for Retry-After, not critical."""
    state = HostTable(ClientConfig()).get("http://b:80")
    state.note_shed(10.0, Priority.STANDARD, 2.0)
    assert state.blocked_s(11.0, Priority.CRITICAL) == 0.0
    assert state.blocked_s(11.0, Priority.STANDARD) == pytest.approx(1.0)
    assert state.blocked_s(11.0, Priority.BULK) == pytest.approx(1.0)
    assert state.blocked_s(12.5, Priority.BULK) == 0.0


def test_host_budget_is_ratio_of_originals_plus_floor() -> None:
    """The per-host retry budget grants ratio * originals + floor retries per window."""
    state = HostTable(ClientConfig()).get("http://b:80")
    for _ in range(100):
        state.budget.record_original(0.0)
    granted = sum(state.budget.try_acquire_retry(0.0) for _ in range(50))
    assert granted == 11  # 0.1 * 100 + floor 1 (0.1 retries/s over 10 s)


def test_latency_is_an_ewma() -> None:
    """Recent latency starts at the first sample and moves a fifth of the way to each next."""
    state = HostTable(ClientConfig()).get("http://b:80")
    state.note_latency(0.100)
    state.note_latency(0.200)
    assert state.latency_s == pytest.approx(0.120)


def test_host_table_is_bounded() -> None:
    """Beyond max_hosts the least recently used host is dropped; labels stay capped."""
    table = HostTable(ClientConfig(max_hosts=4, metrics_max_hosts=2))
    keep = table.get("http://keep:80")
    for i in range(1000):
        table.get(f"http://h{i}:80")
        table.get("http://keep:80")
    assert len(table) == 4
    assert table.get("http://keep:80") is keep
    assert table.evicted == 997
    assert set(table.labels) == {"http://keep:80", "http://h0:80", OTHER}


@pytest.mark.parametrize(
    ("field", "value"),
    [("min_budget_ms", -1.0), ("throttle_k", 0.5), ("throttle_window_ms", 10.5),
     ("budget_ratio", 2.0), ("max_attempts", 0), ("backoff_max_ms", 1.0),
     ("max_hosts", 0), ("default_deadline_ms", 0.0), ("min_retries_per_s", float("nan"))],
)  # fmt: skip
def test_config_validation_names_the_field(field: str, value: object) -> None:
    """An invalid value raises ConfigError naming the field and the range."""
    with pytest.raises(ConfigError, match=rf"client\.{field} must be"):
        ClientConfig(**{field: value})  # type: ignore[arg-type]


def test_config_rejects_a_non_priority_default() -> None:
    """default_priority must be a Priority."""
    with pytest.raises(ConfigError, match=r"client\.default_priority"):
        ClientConfig(default_priority="high")  # type: ignore[arg-type]
