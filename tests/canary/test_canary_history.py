"""The warm start: the stable instances' history, the burst test, the judge that learns."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from ballast_asgi.canary.core.blocks import Block
from ballast_asgi.canary.core.evidence import DEFAULT_PARAMS
from ballast_asgi.canary.core.history import HistoryParams, Regime, StableHistory, dispersion_z
from ballast_asgi.canary.core.judges import SequentialJudge
from experiments.canary import rules, warm
from experiments.canary.model import REGRESSIONS, Cell, simulate

SHORT = HistoryParams(history_s=60.0, window_s=5.0, burst_z=2.33, min_events=10)


def _fill(history: StableHistory, rng: random.Random, seconds: int, burst: bool) -> None:
    """Four instances at 50 rps for ``seconds``, 2 % errors, or bursts of 40 % (1 s in 10)."""
    for t in range(seconds):
        for i in range(4):
            bad = burst and (t + 3 * i) % 10 == 0
            p = 0.4 if bad else (0.0 if burst else 0.02)
            for k in range(50):
                now = t + k / 50
                history.record(f"http://s{i}", rng.random() < p, rng.random() < 0.01, now)


def test_independent_errors_are_calm_and_bursts_are_bursty() -> None:
    """Binomial errors read calm; the same mean rate in 1 s bursts reads bursty."""
    rng = random.Random(4)
    calm, bursty = StableHistory(SHORT, 0.0), StableHistory(SHORT, 0.0)
    _fill(calm, rng, 61, burst=False)
    _fill(bursty, rng, 61, burst=True)
    assert calm.decide(61.0) == {"errors": Regime.CALM, "latency": Regime.CALM}
    assert bursty.decide(61.0)["errors"] is Regime.BURSTY


def test_undecided_until_the_history_is_long_enough() -> None:
    """Less history than ``history_s`` (or too few events): undecided, the judge keeps the cap."""
    h = StableHistory(SHORT, 0.0)
    _fill(h, random.Random(1), 30, burst=False)
    assert h.decide(30.0)["errors"] is Regime.UNDECIDED
    quiet = StableHistory(SHORT, 0.0)
    for t in range(70):
        quiet.record("http://s0", t == 5, None, float(t))
    assert quiet.decide(70.0)["errors"] is Regime.UNDECIDED
    assert quiet.covered_s >= 60.0


def test_a_regime_once_decided_stays() -> None:
    """Calm is decided once; a later burst on stable does not flip it (nor the judge's cap)."""
    rng = random.Random(2)
    h = StableHistory(SHORT, 0.0)
    _fill(h, rng, 61, burst=False)
    assert h.decide(61.0)["errors"] is Regime.CALM
    for k in range(500):
        h.record("http://s0", True, None, 61.0 + k / 100)
    assert h.decide(70.0)["errors"] is Regime.CALM
    shown = h.snapshot()
    assert shown["instances"] == 4 and shown["errors"]["regime"] == "calm"  # type: ignore[index]


def test_idle_time_ages_the_history_out() -> None:
    """A long idle gap leaves empty windows: old counts fall out of the ring."""
    h = StableHistory(SHORT, 0.0)
    h.record("http://s0", True, None, 1.0)
    h.roll(10_000.0)
    assert sum(e for _, e in h.cells("errors")) == 0


def test_dispersion_z_needs_events() -> None:
    """No events, or nothing but events: no statistic."""
    assert dispersion_z([(10, 0), (5, 0)]) is None
    assert dispersion_z([(10, 10)]) is None
    assert dispersion_z([]) is None


def test_the_numpy_test_equals_the_pure_one() -> None:
    """``warm.dispersion_z`` (per trial) equals ``history.dispersion_z`` on the same cells."""
    rng = np.random.default_rng(9)
    n, e, _, _ = warm.history(Cell(200, 0.05, 0.01, model="bursty"), 3, rng, seconds=60)
    got = warm.dispersion_z(n, e, 5)
    for i in range(3):
        cells = [(int(n[i, k, w * 5:(w + 1) * 5].sum()), int(e[i, k, w * 5:(w + 1) * 5].sum()))
                 for k in range(n.shape[1]) for w in range(12)]  # fmt: skip
        assert got[i] == pytest.approx(dispersion_z(cells))


def test_the_simulated_history_reads_as_its_model() -> None:
    """Ten minutes of stable history: independent cells calm, bursty cells bursty (2 % base)."""
    rng = np.random.default_rng(5)
    calm_e, calm_l = warm.regimes(Cell(2000, 0.05, 0.02), 40, rng)
    assert calm_e.mean() >= 0.9 and calm_l.mean() >= 0.9
    bursty_e, bursty_l = warm.regimes(Cell(2000, 0.05, 0.02, model="bursty"), 40, rng)
    assert not bursty_e.any() and bursty_l.mean() >= 0.9


def _judge_with(history: StableHistory) -> SequentialJudge:
    return SequentialJudge(alpha=0.01, history=history, calm_cap_nats=50.0)


def test_the_judge_lifts_the_cap_from_the_next_block_when_calm() -> None:
    """Calm history: the cap is lifted after a block (never inside it); bursty: it stays."""
    rng = random.Random(3)
    calm = StableHistory(SHORT, 0.0)
    _fill(calm, rng, 61, burst=False)
    judge = _judge_with(calm)
    assert judge.errors.cap_nats == DEFAULT_PARAMS.cap_nats
    judge.update(Block(61.0, 62.0, requests_c=5, requests_s=95))
    assert judge.errors.cap_nats == 50.0 and judge.latency.cap_nats == 50.0
    assert judge.statistic()["errors"]["cap_nats"] == 50.0
    bursty = StableHistory(SHORT, 0.0)
    _fill(bursty, rng, 61, burst=True)
    judge = _judge_with(bursty)
    judge.update(Block(61.0, 62.0, requests_c=5, requests_s=95))
    assert judge.errors.cap_nats == DEFAULT_PARAMS.cap_nats
    assert judge.statistic()["stable_history"]["errors"]["regime"] == "bursty"


def test_a_calm_judge_catches_a_high_traffic_regression_faster() -> None:
    """Same blocks (+5 pp at 20 canary rps): the learned judge beats the capped one."""
    rng = random.Random(8)
    calm = StableHistory(SHORT, 0.0)
    _fill(calm, rng, 61, burst=False)
    learned, capped = _judge_with(calm), SequentialJudge(alpha=0.01)
    learned.learn(61.0)
    times: dict[str, float] = {}
    for t in range(120):
        e_c = sum(rng.random() < 0.07 for _ in range(20))
        e_s = sum(rng.random() < 0.02 for _ in range(1980))
        block = Block(61.0 + t, 62.0 + t, requests_c=20, requests_s=1980, errors_c=e_c,
                      errors_s=e_s)  # fmt: skip
        for name, judge in (("learned", learned), ("capped", capped)):
            if name not in times and judge.update(block) is not None:
                times[name] = t + 1.0
    assert times["learned"] < times.get("capped", math.inf)


def test_the_vectorised_rule_with_a_warm_start_matches_the_judge() -> None:
    """Per-trial calm or capped metrics: numpy and the pure judge roll back at the same second."""
    blocks = simulate(Cell(200, 0.1, 0.02, outage=True), REGRESSIONS[1], 6, 300,
                      np.random.default_rng(6))  # fmt: skip
    calm_e = np.array([True, False, True, False, True, True])
    calm_l = np.array([False, True, True, False, True, False])
    got = rules.sequential(blocks, 0.01, calm=(calm_e, calm_l))
    for i in range(6):
        judge = SequentialJudge(alpha=0.01)
        judge.errors.cap_nats = 50.0 if calm_e[i] else DEFAULT_PARAMS.cap_nats
        judge.latency.cap_nats = 50.0 if calm_l[i] else DEFAULT_PARAMS.cap_nats
        when = math.inf
        for t in range(300):
            row = [int(getattr(blocks, f)[i, t]) for f in Block.__slots__[2:]]
            if judge.update(Block(float(t), float(t + 1), *row)) is not None:
                when = t + 1.0
                break
        assert got[i] == when


def test_the_history_config_is_validated() -> None:
    """A window longer than the history, or a zero burst threshold, is refused with the field."""
    from pydantic import ValidationError

    from ballast_asgi.config.canary import CanaryHistoryConfig

    with pytest.raises(ValidationError, match="window_ms"):
        CanaryHistoryConfig(history_ms=10_000, window_ms=20_000)
    with pytest.raises(ValidationError, match="burst_z"):
        CanaryHistoryConfig(burst_z=0.0)
    params = CanaryHistoryConfig(history_ms=60_000, window_ms=2000, min_events=5).params()
    assert (params.history_s, params.window_s, params.min_events) == (60.0, 2.0, 5)
