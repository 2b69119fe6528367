"""The experiment's bottleneck flags, including the hypervisor's steal."""

from __future__ import annotations

from typing import Any

from experiments._harness.cpu import cpu_ticks, steal_all, steal_ticks
from experiments.sweep.checks import bottleneck


def _doc(steal: dict[str, float] | None) -> dict[str, Any]:
    gen = {"schedule_lag_ms": {"p99": 2.0}, "not_issued": 0, "scheduled": 100,
           "cpu_us_per_request": 120.0}  # fmt: skip
    doc: dict[str, Any] = {
        "summary": {"generator": gen},
        "samples": [[0.0, 16, 3, 0, 2.0, 0, -1.0]],
        "cpu_share": {"gateway": 0.5, "sim": 0.1},
        "cpu_busy": {"0": 0.5, "1": 0.6},
    }
    if steal is not None:
        doc["cpu_steal"] = steal
    return doc


def test_steal_above_five_percent_of_a_cpu_is_flagged() -> None:
    """More than 5 % stolen from either CPU raises ``steal``; less, or no record, does not."""
    assert bottleneck(_doc({"0": 0.06, "1": 0.0}))["flags"] == ["steal"]
    assert bottleneck(_doc({"0": 0.01, "1": 0.02}))["flags"] == []
    assert bottleneck(_doc(None))["flags"] == []  # raw data from before steal was recorded


def test_steal_shares_are_read_per_cpu_from_proc_stat() -> None:
    """Every CPU gets a share between 0 and 1 since the first reading."""
    before, ticks = steal_ticks(), cpu_ticks()
    shares = steal_all(before, ticks)
    assert set(shares) == {str(c) for c in ticks}
    assert all(v != v or 0.0 <= v <= 1.0 for v in shares.values())  # NaN when no tick passed
