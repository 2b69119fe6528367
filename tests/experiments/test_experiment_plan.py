"""The plan of ``make experiment`` and the subset options of its command line."""

from __future__ import annotations

from pathlib import Path

from ballast_asgi.config import load_config
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


def test_with_limiters_adds_a_variant_wherever_the_gradient_runs() -> None:
    """A limiter the plan lacks (gradient-blind) runs in the gradient's cells, next to it."""
    specs = plan.with_limiters(plan.full_plan(), ("fixed-64", "gradient", "gradient-blind"))
    swing = [s.limiter for s in specs if s.scenario == "swing"]
    assert swing == ["fixed-64", "gradient", "gradient-blind"]
    sweep8 = [s.limiter for s in specs if s.scenario == "sweep" and s.load_x == 8]
    assert sweep8 == ["fixed-64", "gradient", "gradient-blind"]


def test_blind_limiter_turns_the_loop_lag_correction_off() -> None:
    """gradient-blind is the gradient with limiter.subtract_loop_lag false."""
    from experiments.sweep.one import gateway_yaml

    text = gateway_yaml(plan.swing(24.0, ("gradient-blind",))[0])
    assert "algorithm: gradient\n" in text
    assert "subtract_loop_lag: false" in text


def test_experiment_gateways_stop_at_once_and_keep_every_other_default(tmp_path: Path) -> None:
    """A run's gateway has no drain grace (SIGTERM ends it when its load is over); the
    limiter is the spec's and everything else is the default config."""
    from experiments.sweep.one import gateway_yaml

    path = tmp_path / "gw.yaml"
    path.write_text(gateway_yaml(plan.quick_plan()[0]))  # fixed-16
    config = load_config(env={}, path=path, overrides={"upstream": "http://127.0.0.1:1"})
    assert config.server.drain_grace_ms == 0
    assert config.limiter.algorithm == "fixed" and config.limiter.fixed_limit == 16
    default = load_config(env={}, overrides={"upstream": "http://127.0.0.1:1"})
    assert config.server == default.server.model_copy(update={"drain_grace_ms": 0})
