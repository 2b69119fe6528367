"""The simulation's vectorised rules equal the pure judges, and the judge's H0 guarantee holds."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from ballast_asgi.canary.core.blocks import Block
from ballast_asgi.canary.core.evidence import EvidenceParams
from ballast_asgi.canary.core.judges import (
    FixedHorizonJudge,
    Judge,
    SequentialJudge,
    ThresholdJudge,
)
from experiments.canary import rules
from experiments.canary.model import NONE, REGRESSIONS, Blocks, Cell, simulate


def _pure_times(blocks: Blocks, make: type[Judge], **kw: Any) -> list[float]:
    out = []
    for i in range(blocks.requests_c.shape[0]):
        judge = make(**kw)
        when = math.inf
        for t in range(blocks.requests_c.shape[1]):
            row = [int(getattr(blocks, f)[i, t]) for f in Block.__slots__[2:]]
            if judge.update(Block(float(t), float(t + 1), *row)) is not None:
                when = t + 1.0
                break
        out.append(when)
    return out


@pytest.mark.parametrize(
    ("rule", "judge", "kw"),
    [
        ("sequential", SequentialJudge, {"alpha": 0.01}),
        ("fixed_horizon", FixedHorizonJudge, {"alpha": 0.01, "horizon_s": 120.0}),
        ("threshold", ThresholdJudge, {}),
    ],
)
def test_vectorised_rules_match_the_pure_judges(
    rule: str, judge: type[Judge], kw: dict[str, Any]
) -> None:
    """On the same simulated blocks, numpy and the pure judge roll back at the same second."""
    rng = np.random.default_rng(3)
    cell = Cell(rps=200, share=0.1, base_error=0.02, outage=True)
    blocks = simulate(cell, REGRESSIONS[1], 6, 400, rng)
    if rule == "fixed_horizon":
        got = rules.fixed_horizon(blocks, 0.01, horizon_s=120)
    elif rule == "sequential":
        got = rules.sequential(blocks, 0.01)
    else:
        got = rules.threshold(blocks)
    assert list(got) == _pure_times(blocks, judge, **kw)


def test_vectorised_rule_matches_the_judge_with_other_constants() -> None:
    """Custom grid, prior, cap and one-event gap: numpy and the pure judge still agree."""
    params = EvidenceParams(ratio_min=1.5, ratio_max=40.0, ratio_points=7, prior_power=1.0,
                            cap_nats=0.9, single_event_gap_s=4.0)  # fmt: skip
    rng = np.random.default_rng(8)
    blocks = simulate(Cell(rps=200, share=0.05, base_error=0.01), REGRESSIONS[0], 6, 300, rng)
    got = rules.sequential(blocks, 0.05, error_share=0.7, params=params)
    assert list(got) == _pure_times(
        blocks, SequentialJudge, alpha=0.05, error_share=0.7, params=params
    )


@pytest.mark.parametrize(
    "cell",
    [
        Cell(rps=200, share=0.01, base_error=0.02),
        Cell(rps=200, share=0.25, base_error=0.001, outage=True),
        Cell(rps=2000, share=0.05, base_error=0.005),
    ],
)
def test_good_canaries_roll_back_at_most_alpha(cell: Cell) -> None:
    """Independent errors: 400 identical canaries for 10 minutes, rolled back in <= alpha."""
    blocks = simulate(cell, NONE, 400, 600, np.random.default_rng(17))
    assert float(np.isfinite(rules.sequential(blocks, 0.05)).mean()) <= 0.05


def test_a_small_regression_at_low_traffic_is_caught() -> None:
    """+5 pp on a 2 % base at 200 rps and a 1 % share (two canary requests a second): caught."""
    blocks = simulate(Cell(200, 0.01, 0.02), REGRESSIONS[0], 60, 1800, np.random.default_rng(2))
    times = rules.sequential(blocks, 0.01)
    assert float(np.isfinite(times).mean()) >= 0.95 and float(np.median(times)) <= 150.0


def test_false_rollbacks_under_h0_stay_below_alpha() -> None:
    """1,000 seeded identical canaries for 5 minutes: rolled back in at most alpha of them."""
    rng = np.random.default_rng(20261201)
    cell = Cell(rps=500, share=0.1, base_error=0.02)
    blocks = simulate(cell, NONE, 1000, 300, rng)
    rate = float(np.isfinite(rules.sequential(blocks, 0.05)).mean())
    assert rate <= 0.05


def test_bursty_errors_are_not_a_rollback() -> None:
    """Per-instance error bursts on an identical canary: at most alpha false rollbacks."""
    rng = np.random.default_rng(11)
    cell = Cell(rps=2000, share=0.25, base_error=0.01, model="bursty")
    blocks = simulate(cell, NONE, 300, 600, rng)
    assert float(np.isfinite(rules.sequential(blocks, 0.01)).mean()) <= 0.01


def test_a_regression_is_caught_in_seconds_at_high_traffic() -> None:
    """+5 pp errors at 2,000 rps and a 25 % share: median time to rollback under 20 s."""
    rng = np.random.default_rng(5)
    blocks = simulate(Cell(2000, 0.25, 0.01), REGRESSIONS[0], 100, 120, rng)
    assert float(np.median(rules.sequential(blocks, 0.01))) <= 20.0
