"""Pure parsing of X-Priority and X-Deadline-Ms."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast_asgi.core.deadline import (
    MAX_BUDGET_MS,
    absolute_deadline,
    parse_budget_ms,
    remaining_ms_header,
)
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.priority import Priority, parse_priority


@pytest.mark.parametrize(
    ("raw", "want"),
    [(b"0", Priority.CRITICAL), (b"CRITICAL", Priority.CRITICAL), (b" 1 ", Priority.STANDARD),
     (b"Standard", Priority.STANDARD), (b"2", Priority.BULK), (b"bulk", Priority.BULK)],
)  # fmt: skip
def test_priority_tokens(raw: bytes, want: Priority) -> None:
    """Numbers and names, case-insensitive, map to tiers."""
    assert parse_priority(raw, Priority.STANDARD) is want


def test_priority_absent_uses_default() -> None:
    """No header: the configured default tier."""
    assert parse_priority(None, Priority.BULK) is Priority.BULK


@pytest.mark.parametrize("raw", [b"3", b"-1", b"high", b"", b"0x0", b"\xff"])
def test_priority_malformed_names_header(raw: bytes) -> None:
    """Anything else is an error naming X-Priority."""
    with pytest.raises(HeaderError) as info:
        parse_priority(raw, Priority.STANDARD)
    assert info.value.header == "X-Priority"


@pytest.mark.parametrize("raw", [b"abc", b"nan", b"inf", b"-inf", b"", b"1e12", b"\xff"])
def test_deadline_malformed_names_header(raw: bytes) -> None:
    """Not a finite number, or more than a day: an error naming X-Deadline-Ms."""
    with pytest.raises(HeaderError) as info:
        parse_budget_ms(raw)
    assert info.value.header == "X-Deadline-Ms"


def test_deadline_negative_is_already_expired() -> None:
    """A negative budget is valid and lies in the past."""
    assert absolute_deadline(b"-5", 100.0, None) == pytest.approx(99.995)


def test_deadline_default_and_none() -> None:
    """Absent header: the default budget, or no deadline at all."""
    assert absolute_deadline(None, 10.0, None) is None
    assert absolute_deadline(None, 10.0, 500) == pytest.approx(10.5)


@given(st.floats(min_value=-1e6, max_value=MAX_BUDGET_MS), st.floats(0, 1e6))
def test_deadline_roundtrip(budget: float, now: float) -> None:
    """Forwarded remaining ms never exceeds the budget and is never negative."""
    deadline = absolute_deadline(repr(budget).encode(), now, None)
    assert deadline is not None
    forwarded = int(remaining_ms_header(deadline, now))
    assert 0 <= forwarded <= max(0, math.ceil(budget))
