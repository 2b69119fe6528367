"""The discovery experiment's arithmetic: matching marks with applied versions, percentiles."""

from __future__ import annotations

from experiments.discovery.analysis import Applied, first_applied, latencies_ms, merge_history
from experiments.discovery.report import pct

A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"


def _applied() -> Applied:
    applied: Applied = {}
    merge_history(applied, "gw0", {"discovery": {"history": [
        {"config_version": 1, "applied_at": 10.0, "instances": [A]},
        {"config_version": 2, "applied_at": 20.1, "instances": [A, B]},
        {"config_version": 3, "applied_at": 30.1, "instances": [A]},
    ]}})  # fmt: skip
    merge_history(applied, "gw1", {"discovery": {"history": [
        {"config_version": 2, "applied_at": 20.2, "instances": [A, B]},
        {"config_version": 3, "applied_at": 30.3, "instances": [A]},
    ]}})  # fmt: skip
    return applied


def test_applied_in_both_is_the_later_gateway() -> None:
    """A registration counts as applied when the slower gateway has it."""
    assert first_applied(_applied(), B, 20.0, present=True) == 20.2
    assert first_applied(_applied(), B, 30.0, present=False) == 30.3


def test_a_gateway_that_never_applied_means_never() -> None:
    """If one gateway has no matching version, the mark is counted as never applied."""
    applied = _applied()
    del applied["gw1"][3]
    assert first_applied(applied, B, 30.0, present=False) is None
    lat, missing = latencies_ms(applied, [(B, 20.0), (B, 30.0)], present=True)
    assert missing == 1 and [round(x) for x in lat] == [200]


def test_merge_history_is_idempotent() -> None:
    """Merging the same snapshot twice changes nothing (history overlaps between runs)."""
    applied = _applied()
    merge_history(applied, "gw0", {"discovery": {"history": [
        {"config_version": 2, "applied_at": 20.1, "instances": [A, B]}]}})  # fmt: skip
    assert len(applied["gw0"]) == 3


def test_percentiles_of_few_samples() -> None:
    """With 31 samples p99 is the largest; no samples give None, not 0."""
    values = [float(v) for v in range(1, 32)]
    assert pct(values, 50) == 16.0 and pct(values, 99) == 31.0
    assert pct([], 50) is None and pct([7.0], 99) == 7.0
