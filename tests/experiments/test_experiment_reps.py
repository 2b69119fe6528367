"""Every experiment cell is the median of its repetitions, with the range kept."""

from __future__ import annotations

from typing import Any

from experiments.sweep.reps import combine, group, median_run, spread_text


def _doc(rep: int, p99_ms: float, served: int) -> dict[str, Any]:
    """A minimal raw run document, as ``one.py`` writes it."""
    tier = {"sent": 100, "served": served, "not_issued": 0, "shed_by_reason": {},
            "latency_all_ms": {"p99": p99_ms}, "latency_served_ms": {"p99": p99_ms}}  # fmt: skip
    return {
        "spec": {
            "scenario": "sweep",
            "label": "gradient",
            "load_x": 12,
            "k": 1.0,
            "events": [],
            "rep": rep,
        },
        "summary": {
            "tiers": {"critical": tier},
            "generator": {
                "schedule_lag_ms": {"p99": 1.0},
                "not_issued": 0,
                "scheduled": 100,
                "cpu_us_per_request": 50.0,
            },
        },
        "samples": [[0.0, 10, 5, 0, 1.0, 0]],
        "cpu_share": {"gateway": 0.5, "sim": 0.1},
    }


def test_cell_is_the_median_with_its_range() -> None:
    """Three runs: the cell shows the middle value and the lowest and highest."""
    docs = [_doc(0, 180.0, 99), _doc(1, 150.0, 100), _doc(2, 210.0, 97)]
    m = combine(docs)
    assert m["n"] == 3
    assert m["critical_p99_ms"] == 180.0 and m["range"]["critical_p99_ms"] == (150.0, 210.0)
    assert m["critical_served"] == 99 and m["range"]["critical_served"] == (97, 100)
    assert spread_text(m, "critical_p99_ms", " ms") == " (150-210 ms)"


def test_median_run_is_the_one_with_the_median_headline() -> None:
    """Limit ranges are taken from the run whose critical p99 is the median."""
    docs = [_doc(0, 180.0, 99), _doc(1, 150.0, 100), _doc(2, 210.0, 97)]
    assert median_run(docs)["spec"]["rep"] == 0


def test_single_run_shows_no_range_and_runs_group_by_cell() -> None:
    """One run per cell prints the bare number; grouping keys on scenario, label and load."""
    docs = [_doc(0, 180.0, 99)]
    assert spread_text(combine(docs), "critical_p99_ms") == ""
    assert list(group(docs)) == [("sweep", "gradient", 12)]
