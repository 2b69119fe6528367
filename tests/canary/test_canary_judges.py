"""The canary judges: the e-process's arithmetic and validity, and the two baselines."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ballast_asgi.canary.core.blocks import Block
from ballast_asgi.canary.core.evidence import (
    EvidenceParams,
    MixtureEProcess,
    block_log_ratio,
    capped_log_ratio,
    log_sum_exp,
)
from ballast_asgi.canary.core.judges import (
    FixedHorizonJudge,
    SequentialJudge,
    ThresholdJudge,
    make_judge,
    two_proportion_z,
)


def _block(t: int, **counts: int) -> Block:
    return Block(float(t), float(t + 1), **counts)


@given(
    st.integers(0, 50), st.integers(0, 500), st.floats(0.001, 0.999), st.floats(1.01, 500.0),
    st.floats(0.01, 20.0), st.booleans(),
)  # fmt: skip
def test_capped_block_never_exceeds_the_likelihood_ratio(
    events_c: int, events_s: int, share: float, ratio: float, cap: float, one_event: bool
) -> None:
    """What a block adds is at most its true log likelihood ratio (the validity argument)."""
    e = events_c + events_s
    assert (
        capped_log_ratio(events_c, e, share, ratio, cap, one_event)
        <= block_log_ratio(events_c, e, share, ratio) + 1e-12
    )


@given(st.integers(1, 40), st.floats(0.01, 0.9), st.floats(1.01, 300.0), st.floats(0.05, 5.0),
       st.booleans())  # fmt: skip
def test_capped_block_has_expectation_at_most_one_under_the_null(
    e: int, q: float, r: float, cap: float, one_event: bool
) -> None:
    """Whatever the cap and the allowance, a block's factor averages <= 1 under Binomial(e, q)."""
    total = sum(
        math.comb(e, k) * q**k * (1 - q) ** (e - k)
        * math.exp(capped_log_ratio(k, e, q, r, cap, one_event))
        for k in range(e + 1)
    )  # fmt: skip
    assert total <= 1.0 + 1e-9


def test_prior_weights_sum_to_one_and_favour_small_risks() -> None:
    """ln(r)^-2 weights: normalised, decreasing along the grid; power 0 is uniform."""
    params = EvidenceParams()
    weights = [math.exp(w) for w in params.log_weights()]
    assert math.isclose(sum(weights), 1.0) and weights == sorted(weights, reverse=True)
    ratios = params.ratios()
    assert math.isclose(ratios[0], 2.0) and math.isclose(ratios[-1], 250.0) and len(ratios) == 12
    flat = EvidenceParams(prior_power=0.0).log_weights()
    assert all(math.isclose(w, -math.log(12)) for w in flat)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"ratio_min": 1.0}, "ratio_min"),
        ({"ratio_min": 5.0, "ratio_max": 3.0}, "ratio_max"),
        ({"ratio_points": 1}, "ratio_points"),
        ({"prior_power": -1.0}, "prior_power"),
        ({"cap_nats": 0.0}, "cap_nats"),
        ({"single_event_gap_s": -1.0}, "single_event_gap_s"),
    ],
)
def test_evidence_params_are_validated(kw: dict[str, float], match: str) -> None:
    """Impossible constants are refused with the parameter's name."""
    with pytest.raises(ValueError, match=match):
        EvidenceParams(**kw)  # type: ignore[arg-type]


def test_a_clump_of_canary_errors_counts_once_within_the_gap() -> None:
    """Canary errors 1 s apart: the second adds at most the cap; 5 s later one counts in full."""
    params = EvidenceParams(ratio_min=50.0, ratio_max=50.0, ratio_points=1, prior_power=0.0)
    proc = MixtureEProcess(params)
    full = capped_log_ratio(1, 2, 0.01, 50.0, params.cap_nats)
    proc.update(1, 1, 0.01, at=0.0)
    assert math.isclose(proc.log_e, full) and full > params.cap_nats
    proc.update(1, 1, 0.01, at=1.0)
    assert math.isclose(proc.log_e, full + params.cap_nats)
    proc.update(1, 1, 0.01, at=6.0)
    assert math.isclose(proc.log_e, 2 * full + params.cap_nats)


@given(st.integers(1, 40), st.floats(0.01, 0.9), st.floats(1.01, 300.0))
def test_block_ratio_has_expectation_one_under_the_null(e: int, q: float, r: float) -> None:
    """Averaged over Binomial(e, q) canary events, the block's likelihood ratio is exactly 1."""
    total = sum(
        math.comb(e, k) * q**k * (1 - q) ** (e - k) * math.exp(block_log_ratio(k, e, q, r))
        for k in range(e + 1)
    )
    assert math.isclose(total, 1.0, rel_tol=1e-9)


def test_log_sum_exp_is_stable_for_large_values() -> None:
    """log-sum-exp of huge values does not overflow."""
    assert math.isclose(log_sum_exp([1000.0, 1000.0]), 1000.0 + math.log(2))


def test_no_events_or_one_sided_traffic_adds_nothing() -> None:
    """Blocks without events, or with traffic on one side only, leave the e-value at 1."""
    proc = MixtureEProcess()
    proc.update(0, 0, 0.1)
    proc.update(3, 0, 1.0)
    proc.update(0, 3, 0.0)
    assert proc.log_e == 0.0 and proc.blocks == 0


def test_a_shared_outage_is_not_evidence() -> None:
    """Half of everything failing on both sides, in proportion to traffic, lowers the e-value."""
    judge = SequentialJudge(alpha=0.01)
    for t in range(30):
        block = _block(t, requests_c=100, requests_s=900, errors_c=50, errors_s=450)
        assert judge.update(block) is None
    assert judge.errors.log_e < 0.0


def test_a_bad_canary_is_rolled_back_on_errors_with_evidence() -> None:
    """30 % canary errors against 1 % stable: an errors verdict within seconds, with counts."""
    judge = SequentialJudge(alpha=0.01)
    verdict = None
    t = 0
    while verdict is None:
        verdict = judge.update(_block(t, requests_c=10, requests_s=90, errors_c=3, errors_s=1))
        t += 1
    assert verdict.reason == "errors" and t <= 15
    assert verdict.evidence["counts"]["canary"]["errors"] == 3 * t
    assert verdict.evidence["errors"]["log_e_value"] >= verdict.evidence["errors"]["log_bound"]


def test_sparse_errors_against_a_zero_baseline_are_caught() -> None:
    """A canary error every other second, none on stable: a regression (Kayenta misses it)."""
    judge = SequentialJudge(alpha=0.01)
    verdicts = [
        judge.update(_block(t, requests_c=20, requests_s=180, errors_c=t % 2)) for t in range(120)
    ]
    assert any(v is not None and v.reason == "errors" for v in verdicts)


def test_a_slow_canary_is_rolled_back_on_latency() -> None:
    """A canary with a third of its requests over the stable p99 goes on latency."""
    judge = SequentialJudge(alpha=0.01)
    verdict = None
    for t in range(60):
        block = _block(t, requests_c=10, requests_s=90, timed_c=10, timed_s=90, slow_c=3, slow_s=1)
        verdict = verdict or judge.update(block)
    assert verdict is not None and verdict.reason == "latency"


def test_low_traffic_waits() -> None:
    """No canary traffic for an hour: no verdict, no evidence."""
    judge = SequentialJudge()
    for t in range(3600):
        assert judge.update(_block(t, requests_s=5, errors_s=1)) is None
    assert judge.errors.log_e == 0.0


def test_fixed_horizon_decides_once_at_the_horizon() -> None:
    """The z-test waits for its horizon, then rolls back a canary with 5 % vs 1 % errors."""
    judge = FixedHorizonJudge(alpha=0.01, horizon_s=60)
    results = [
        judge.update(_block(t, requests_c=20, requests_s=180, errors_c=1, errors_s=2))
        for t in range(70)
    ]
    assert all(r is None for r in results[:59]) and results[59] is not None
    assert all(r is None for r in results[60:])


def test_two_proportion_z_matches_a_hand_computation() -> None:
    """z for 10/100 vs 5/100 is 0.05 / sqrt(0.075 * 0.925 * 0.02)."""
    expected = 0.05 / math.sqrt(0.075 * 0.925 * 0.02)
    assert math.isclose(two_proportion_z(10, 100, 5, 100), expected)
    assert two_proportion_z(0, 0, 1, 10) == 0.0


def test_threshold_rolls_back_after_five_failed_checks() -> None:
    """Flagger-like: 2 % errors fail every 60 s check; the fifth failed check rolls back."""
    judge = ThresholdJudge()
    verdict, t = None, 0
    while verdict is None:
        verdict = judge.update(_block(t, requests_c=50, errors_c=1))
        t += 1
    assert t == 300 and judge.failed_checks == 5


def test_make_judge_names_the_rules() -> None:
    """Each rule name builds its judge; an unknown one is refused by name."""
    assert {make_judge(n).name for n in ("sequential", "fixed_horizon", "threshold")} == {
        "sequential", "fixed_horizon", "threshold"
    }  # fmt: skip
    try:
        make_judge("vibes")
    except ValueError as exc:
        assert "vibes" in str(exc)
    else:
        raise AssertionError("unknown rule accepted")


def test_canary_cores_import_nothing_heavy() -> None:
    """The canary's pure cores load in a fresh interpreter without any adapter library."""
    import subprocess
    import sys

    mods = [
        f"ballast_asgi.canary.{m}" for m in ("evidence", "blocks", "judges", "rollout", "split")
    ]
    heavy = ("starlette", "httpx", "aiohttp", "prometheus_client", "pydantic", "uvicorn", "anyio")
    code = (
        f"import sys, importlib; [importlib.import_module(m) for m in {mods!r}]; "
        f"print(','.join(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
