"""The per-client evidence budget: a cap per client per judge block, a bounded table."""

from __future__ import annotations

import pytest

from ballast_asgi.canary.core.clients import ClientBudget


def test_one_client_counts_at_most_its_cap_per_window() -> None:
    """A client's outcomes beyond per_window in one block are not judged; the next block resets."""
    budget = ClientBudget(3)
    assert [budget.admit("10.0.0.1", 0.0) for _ in range(5)] == [True] * 3 + [False] * 2
    assert budget.admit("10.0.0.2", 0.0)  # another client has its own cap
    assert budget.dropped == 2
    assert [budget.admit("10.0.0.1", 1.0) for _ in range(4)] == [True] * 3 + [False]


def test_the_table_is_bounded_and_late_clients_share_one_cap() -> None:
    """Past max_clients in a block, new clients share one overflow entry (memory stays bounded)."""
    budget = ClientBudget(2, max_clients=10)
    for i in range(10):
        assert budget.admit(f"10.0.0.{i}", 5.0)
    admitted = [budget.admit(f"2001:db8::{i}", 5.0) for i in range(1000)]
    assert admitted.count(True) == 2 and len(budget) == 11
    assert budget.admit("2001:db8::ffff", 6.0)  # a new block starts with an empty table
    assert len(budget) == 1


def test_requests_without_an_address_are_one_client() -> None:
    """No client address: all such outcomes share one cap."""
    budget = ClientBudget(1)
    assert budget.admit(None, 0.0) and not budget.admit("", 0.0)


def test_bad_limits_are_refused() -> None:
    """per_window and max_clients below 1 are errors naming both."""
    with pytest.raises(ValueError, match="per_window and max_clients"):
        ClientBudget(0)
