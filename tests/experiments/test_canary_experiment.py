"""The canary experiment: chunked cells, per-cell intervals, the empirical-null exploration."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from experiments.canary import empirical_null, rules, sim, tables, warm
from experiments.canary.__main__ import _provenance
from experiments.canary.model import NONE, REGRESSIONS, Cell, simulate


def test_a_large_cell_runs_in_seeded_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """More trials than a chunk: every trial is judged, and the same seed gives the same times."""
    monkeypatch.setattr(sim, "CHUNK", 4)
    cell = Cell(200, 0.25, 0.02, model="bursty")
    first = sim.run_cell(cell, REGRESSIONS[0], 10, seed=3)
    again = sim.run_cell(cell, REGRESSIONS[0], 10, seed=3)
    assert [len(r.times) for r in first] == [10, 10, 10]
    assert [r.times for r in first] == [r.times for r in again]
    assert first[0].times[:4] != first[0].times[4:8]  # chunks draw from their own seeds


def test_a_small_cell_keeps_its_single_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most one chunk: the blocks come from the cell's own seed, the history from its own."""
    cell = Cell(200, 0.05, 0.01)
    result = sim.run_cell(cell, REGRESSIONS[0], 5, seed=9)
    rng = np.random.default_rng(sim._seed(9, cell, REGRESSIONS[0].name))
    blocks = simulate(cell, REGRESSIONS[0], 5, sim.H1_HORIZON_S, rng)
    history = np.random.default_rng(sim._seed(9, cell, REGRESSIONS[0].name, "history"))
    calm = warm.regimes(cell, 5, history)
    assert list(result[0].times) == [float(t) for t in rules.sequential(blocks, sim.ALPHA,
                                                                       calm=calm)]  # fmt: skip
    assert result[0].calm == float(calm[0].mean()) and result[1].calm is None
    fixed = [float(t) for t in rules.fixed_horizon(blocks, sim.ALPHA)]
    assert list(result[1].times) == fixed  # the baselines see the very same blocks


def test_fr_trials_and_rolled_back_come_from_the_results() -> None:
    """The false-rollback grid's trial count and each result's rollbacks are read, not assumed."""
    cell = Cell(200, 0.01, 0.01)
    h0 = sim.Result(cell, "none", "sequential", (math.inf, 12.0, math.inf, math.inf))
    h1 = sim.Result(cell, "+5 pp errors", "sequential", (3.0,) * 7)
    assert sim.fr_trials([h0, h1]) == 4
    assert h0.rolled_back == 1 and h0.as_dict()["trials"] == 4


def test_the_cell_table_shows_each_rate_with_its_interval() -> None:
    """5 of 300 rolled back reads 1.7 % with the Wilson interval 0.7-3.8."""
    times = (5.0,) * 5 + (math.inf,) * 295
    results = [
        sim.Result(Cell(rps, share, base, outage, model), "none", "sequential", times)
        for model in sim.MODELS for outage in (False, True) for rps in sim.RPS
        for share in sim.SHARES for base in sim.BASE_ERRORS
    ]  # fmt: skip
    table = tables.false_rollbacks_by_cell(results, "sequential")
    assert "| 1.7 % (0.7-3.8) |" in table
    assert table.count("1.7 % (0.7-3.8)") == 96


def test_stable_dispersion_is_one_for_independent_errors_and_large_for_bursts() -> None:
    """The stable side's clumping: about 1 when errors are independent, well above when bursty."""
    rng = np.random.default_rng(4)
    calm = simulate(Cell(2000, 0.05, 0.02), NONE, 20, 400, rng)
    bursty = simulate(Cell(2000, 0.05, 0.02, model="bursty"), NONE, 20, 400, rng)
    phi_calm = empirical_null.dispersion(calm.requests_c, calm.requests_s, calm.errors_s)
    phi_bursty = empirical_null.dispersion(bursty.requests_c, bursty.requests_s, bursty.errors_s)
    assert phi_calm.min() >= 1.0 and float(np.median(phi_calm[:, 100:])) < 1.05
    assert float(np.median(phi_bursty[:, 100:])) > 5.0
    assert (phi_calm[:, 0] == 1.0).all()  # nothing before the first block: no discount


def test_the_default_variant_is_the_judge() -> None:
    """The exploration's reference row judges exactly as the vectorised sequential rule."""
    rng = np.random.default_rng(6)
    blocks = simulate(Cell(200, 0.05, 0.02), REGRESSIONS[0], 8, 300, rng)
    default = empirical_null.VARIANTS[0]
    assert list(empirical_null.judge(default, blocks)) == list(rules.sequential(blocks, 0.01))


def test_a_calm_stable_side_lets_the_quasi_variant_use_the_large_cap() -> None:
    """Independent errors at 2,000 rps: the quasi-likelihood variant is faster than the default."""
    rng = np.random.default_rng(5)
    blocks = simulate(Cell(2000, 0.01, 0.02), REGRESSIONS[0], 40, 120, rng)
    quasi = float(np.median(empirical_null.judge(empirical_null.VARIANTS[1], blocks)))
    assert quasi < float(np.median(rules.sequential(blocks, 0.01)))


def _grid(rolled_back: dict[int, int], trials: int = 3000, cells: int = 96) -> list[sim.Result]:
    """The first ``cells`` cells of the false-rollback grid, cell i with ``rolled_back[i]``."""
    out = []
    for i, cell in enumerate(list(sim.h0_cells())[:cells]):
        k = rolled_back.get(i, 0)
        times = (5.0,) * k + (math.inf,) * (trials - k)
        out.append(sim.Result(cell, "none", "sequential", times))
    return out


def test_target_one_is_stated_from_rates_and_intervals() -> None:
    """Met when no cell is over 1 %; missed when one is, and said when beyond sampling doubt."""
    assert tables.fr_verdict(_grid({0: 30, 5: 3})).startswith("Target 1 is met")
    unsure = tables.fr_verdict(_grid({7: 33}))
    assert unsure.startswith("Target 1 is missed as stated") and "none is above" in unsure
    assert "beyond sampling doubt (worst 2.0 %)" in tables.fr_verdict(_grid({3: 60}))


def test_cells_not_run_are_shown_and_keep_target_one_open() -> None:
    """A grid cut short: the missing cells read 'not run' and target 1 is not called met."""
    short = _grid({}, cells=90)
    assert tables.fr_verdict(short) == "Target 1 cannot be stated: 6 cell(s) were not run."
    assert tables.false_rollbacks_by_cell(short, "sequential").count("not run") == 6
    assert "6 cell(s) not run" in tables.fr_verdict(_grid({1: 40}, cells=90))


def test_the_exploration_section_renders_every_variant() -> None:
    """The docs section lists each variant with its worst cell and +5 pp medians."""
    rows = [
        empirical_null.Row(v.name, 0.01 * k, Cell(200, 0.25, 0.005, model="bursty"), 0.004,
                           {(2000, 0.01): 11.0, (200, 0.01): 80.0})
        for k, v in enumerate(empirical_null.VARIANTS)
    ]  # fmt: skip
    text = empirical_null.section(rows)
    assert all(f"| {v.name} |" in text for v in empirical_null.VARIANTS)
    assert "| 4.0 % | 200 rps, 25 % share, 0.5 % base | 0.40 % | 11 s | 80 s |" in text


def test_the_false_rollback_page_states_target_one_and_every_cell() -> None:
    """The standalone page: provenance, the verdict, pooled rates and the 'not run' cells."""
    from experiments.canary import fr_report

    text = fr_report.render(_grid({60: 34}, cells=85), "partial.pkl")
    assert "From `partial.pkl`: 3,000 trials in each of the 48 independent cells" in text
    assert "3,000 trials in each of the 37 bursty cells at 200 and 2,000 rps" in text
    assert "85 of the 96 cells" in text and text.count("not run") == 11 + 2
    assert "Target 1 is missed as stated (1 cell(s) measured above 1 %; 11 cell(s) not run)" in text
    assert "| bursty | 37 | 34 / 111000 = 0.03 % |" in text


def test_the_small_cell_note_appears_only_at_few_trials() -> None:
    """At 300 trials per independent cell the report explains chance readings over 1 %."""
    note = tables._small_cells_note(300)
    assert "300 trials" in note and "about 3 %" in note and "1.6 of 48" in note
    assert tables._small_cells_note(3_000) == ""
    assert tables._binom_tail(0.5, 2, 1) == pytest.approx(0.75)


def test_a_reused_simulation_says_how_the_report_was_made() -> None:
    """``--reuse`` with a live run: the report names both invocations and the live run's load."""

    args = type("A", (), {"reuse": Path("runs/canary-x"), "live_from": None})()
    text = _provenance(args, ["--reuse", "runs/canary-x"], ("2026-12-01 21:50 UTC", (1, 2, 3)))
    assert "`python -m experiments.canary --reuse runs/canary-x`" in text
    assert "from 2026-12-01 21:50 UTC (load average 1.00, 2.00, 3.00" in text
    plain = type("A", (), {"reuse": None, "live_from": None})()
    assert _provenance(plain, [], None) == ""
