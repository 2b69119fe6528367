"""``make demo``'s summary is words, not Python dicts, and explains expired and deadline sheds."""

from __future__ import annotations

from typing import Any

from experiments.demo.run import LEGEND, outcome_lines


def _summary() -> dict[str, Any]:
    tier = {"shed_by_reason": {}, "expired_by": {}, "errors_by": {}}
    standard = {"shed_by_reason": {"deadline": 812, "queue_full": 30},
                "expired_by": {"late": 4}, "errors_by": {}}  # fmt: skip
    return {"tiers": {"critical": tier, "standard": standard, "bulk": tier},
            "generator": {"sent": 900, "scheduled": 900, "achieved_rps": 300.0,
                          "not_issued": 0}}  # fmt: skip


def test_outcomes_in_words() -> None:
    """Counts by reason read '812 deadline, 30 queue_full'; no braces anywhere."""
    lines = outcome_lines(_summary())
    assert lines[0] == "  standard: shed 812 deadline, 30 queue_full; expired 4 late"
    assert not any("{" in ln for ln in lines)


def test_legend_explains_expired_and_deadline() -> None:
    """The legend says what 'expired' is and why standard traffic is shed by 'deadline'."""
    assert "expired  the client's deadline passed" in LEGEND
    assert "'deadline': the request's X-Deadline-Ms budget ran out" in LEGEND
    assert "Standard and bulk" in LEGEND
