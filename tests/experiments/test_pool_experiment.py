"""The pool experiment's measurements (pure): failures in the break, time to isolation, share."""

from __future__ import annotations

from dataclasses import dataclass

from experiments.pool import analysis


@dataclass
class Rec:
    intended_s: float
    outcome: str
    detail: str = ""


def test_failures_split_failed_late_and_not_issued() -> None:
    """Errors and sheds are failed, late 2xx and timeouts are late, skipped are apart."""
    records = [Rec(0.5, "error"), Rec(1.0, "error"), Rec(1.1, "expired", "late"),
               Rec(1.2, "expired", "504"), Rec(1.3, "shed"), Rec(1.4, "not_issued"),
               Rec(1.5, "served"), Rec(3.0, "error")]  # fmt: skip
    assert analysis.failures(records, 1.0, 2.0) == {
        "failed": 3, "late": 1, "sent": 5, "not_issued": 1,
    }  # fmt: skip


POLLS: list[analysis.Poll] = [
    (0.9, [0, 0, 0]),
    (1.0, [10, 10, 10]),
    (1.1, [15, 20, 20]),  # fault at 1.0: broken still gets 5 of 25
    (1.2, [15, 30, 30]),
    (1.3, [15, 40, 40]),
]


def test_isolation_is_the_end_of_the_last_bin_over_one_percent() -> None:
    """The broken instance's last >= 1 % bin ends at 1.1: isolated 100 ms after the fault."""
    assert analysis.isolation_s(POLLS, 0, 1.0, 1.3) == 0.10000000000000009


def test_not_isolated_when_the_last_bin_still_touches() -> None:
    """A break ending while the broken one still gets traffic is None (not isolated)."""
    polls = [*POLLS, (1.4, [20, 45, 45])]
    assert analysis.isolation_s(polls, 0, 1.0, 1.4) is None


def test_touched_share_and_median_with_none() -> None:
    """The share over the break; None ranks above every number in the median."""
    assert analysis.touched(POLLS, 0, 1.0, 1.3) == 5 / 65
    assert analysis.median([0.2, None, 0.1]) == 0.2
    assert analysis.median([None, None, 0.1]) is None
    assert analysis.median([0.1, 0.3]) == 0.2
