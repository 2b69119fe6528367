"""The plan of ``make experiment`` and the subset options of its command line."""

from __future__ import annotations

from experiments.sweep import plan
from experiments.sweep.run import _parser


def test_full_plan_has_the_competitors_where_the_limit_must_move() -> None:
    """Degrade and swing run gradient2 and vegas beside gradient and the fixed limits."""
    cells = {(s.scenario, s.limiter) for s in plan.full_plan()}
    for scenario in ("degrade", "swing"):
        for lim in ("fixed-16", "fixed-64", "fixed-256", "gradient", "gradient2", "vegas"):
            assert (scenario, lim) in cells
    sweep = {lim for sc, lim in cells if sc == "sweep"}
    assert sweep == set(plan.SWEEP_LIMITERS)


def test_subset_options_parse() -> None:
    """--limiters and --loads are accepted and kept as given."""
    args = _parser().parse_args(["--limiters", "gradient,fixed-64", "--loads", "1,12"])
    assert args.limiters == "gradient,fixed-64"
    assert args.loads == "1,12"
