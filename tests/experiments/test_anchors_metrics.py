"""``experiments.anchors.metrics``: windows, convergence, drift, RSS, reaction (synthetic data)."""

from __future__ import annotations

import math

import pytest

from experiments.anchors.metrics import (
    Rec,
    Window,
    converged_at,
    drift,
    first_good,
    goodput_rps,
    limit_at,
    reaction_s,
    rss_growth,
    served_share,
    tier_counts,
    windows,
    worst_window,
)

NAN = math.nan


def _series(rate: float, t0: float, t1: float, outcome: str, latency: float = 0.05,
            tier: int = 1) -> list[Rec]:  # fmt: skip
    """``rate`` requests per second intended in ``[t0, t1)``, all with one outcome."""
    n = round((t1 - t0) * rate)
    return [(t0 + i / rate, tier, outcome, NAN if outcome == "not_issued" else latency)
            for i in range(n)]  # fmt: skip


def test_windows_count_offered_issued_admitted_served() -> None:
    """Shed is issued but not admitted; not issued is offered only; expired is admitted."""
    recs = [(0.1, 0, "served", 0.05), (0.2, 0, "shed", 0.001), (0.3, 1, "expired", 0.5),
            (0.4, 2, "not_issued", NAN), (1.1, 0, "served", 0.05)]  # fmt: skip
    (w0, w1) = windows(recs, 0.0, 2.0, 1.0, 1.0)
    assert (w0.offered, w0.issued, w0.admitted, w0.served) == (4, 3, 2, 1)
    assert (w1.offered, w1.served) == (1, 1)
    assert w0.goodput_rps == 1.0 and not w0.admitted_ok and w1.admitted_ok
    only_critical = windows(recs, 0.0, 2.0, 1.0, 1.0, frozenset({0}))
    assert [w.offered for w in only_critical] == [2, 1]


def test_windows_by_completion_move_requests_to_their_end() -> None:
    """By completion a request counts where it finished; a not-issued one where it was due."""
    recs = [(0.9, 0, "served", 0.3), (0.5, 1, "not_issued", NAN)]
    by_intent = windows(recs, 0.0, 2.0, 1.0, 1.0)
    by_end = windows(recs, 0.0, 2.0, 1.0, 1.0, by_completion=True)
    assert [w.served for w in by_intent] == [1, 0]
    assert [w.served for w in by_end] == [0, 1]
    assert [w.offered for w in by_end] == [1, 1]


def test_windows_slide_and_stop_inside_the_range() -> None:
    """Windows step by ``step_s`` and never reach past ``t1``; bad arguments are refused."""
    wins = windows([], 10.0, 12.0, 1.0, 0.25)
    assert [w.start_s for w in wins] == [10.0, 10.25, 10.5, 10.75, 11.0]
    with pytest.raises(ValueError, match="width_s and step_s"):
        windows([], 0.0, 1.0, 0.0, 0.1)


def test_converged_at_is_the_start_of_the_good_suffix() -> None:
    """Late answers to requests sent until 11.5 s (they end 0.6 s later), then good: 12.1 s."""
    recs = _series(260, 10.0, 11.5, "expired", 0.6) + _series(260, 11.5, 20.0, "served")
    wins = windows(recs, 10.0, 20.0, 1.0, 0.1, by_completion=True)
    at = converged_at(wins, 0.95 * 250)
    assert at == pytest.approx(12.1)


def test_converged_at_needs_goodput_as_well_as_latency() -> None:
    """Everything served in time but at 200 rps: never converged to 95 % of 250 rps."""
    wins = windows(_series(200, 0.0, 10.0, "served"), 0.0, 10.0, 1.0, 0.1)
    assert converged_at(wins, 0.95 * 250) is None
    assert converged_at(wins, 0.0) == 0.0  # the latency half alone holds at once


def test_a_late_dip_moves_convergence_past_it() -> None:
    """A bad window near the end resets "stays": convergence is after the dip."""
    recs = _series(260, 0.0, 6.0, "served") + _series(100, 6.0, 7.0, "served")
    recs += _series(260, 7.0, 10.0, "served")
    at = converged_at(windows(recs, 0.0, 10.0, 1.0, 0.5), 237.5)
    assert at == 7.0
    ends_bad = _series(260, 0.0, 9.0, "served") + _series(10, 9.0, 10.0, "served")
    assert converged_at(windows(ends_bad, 0.0, 10.0, 1.0, 0.5), 237.5) is None
    assert converged_at([], 1.0) is None


def test_first_good_window_and_the_bad_ones_after_it() -> None:
    """Good from 1 s, one dip at 6-7 s: first good 1 s, bad windows counted after it."""
    recs = _series(100, 0.0, 1.0, "served") + _series(260, 1.0, 6.0, "served")
    recs += _series(100, 6.0, 7.0, "served") + _series(260, 7.0, 10.0, "served")
    wins = windows(recs, 0.0, 10.0, 1.0, 1.0)
    assert first_good(wins, 237.5) == (1.0, 1)
    assert first_good(windows(_series(10, 0.0, 3.0, "served"), 0.0, 3.0, 1.0, 1.0), 237.5) == (
        None,
        0,
    )


def test_goodput_counts_served_by_completion() -> None:
    """Goodput over a span counts served requests that finished in it, per second."""
    recs = [(0.0, 0, "served", 0.5), (0.9, 0, "served", 0.5), (0.2, 0, "expired", 0.3)]
    assert goodput_rps(recs, 0.0, 1.0) == 1.0
    assert goodput_rps(recs, 1.0, 2.0) == 1.0


def test_tier_counts_and_served_share_leave_the_generator_out() -> None:
    """Served / issued per tier; not issued is counted but not in the share."""
    recs = [(0.1, 0, "served", 0.1)] * 998 + [(0.2, 0, "shed", 0.0), (0.3, 0, "not_issued", NAN)]
    recs += [(0.4, 1, "served", 0.1)]
    c = tier_counts(recs, 0, 0.0, 1.0)
    assert c == {"offered": 1000, "served": 998, "shed": 1, "expired": 0, "error": 0,
                 "not_issued": 1}  # fmt: skip
    assert served_share(c) == pytest.approx(998 / 999)
    assert served_share(tier_counts(recs, 2, 0.0, 1.0)) is None


def test_worst_window_finds_the_dip_in_critical_success() -> None:
    """Per 10 s window of critical, the lowest served / issued and where it was."""
    recs = _series(15, 0.0, 30.0, "served", tier=0)
    recs[200] = (recs[200][0], 0, "shed", 0.001)
    wins = windows(recs, 0.0, 30.0, 10.0, 10.0, frozenset({0}))
    worst = worst_window(wins)
    assert worst is not None and worst.start_s == 10.0
    assert worst.success == pytest.approx(149 / 150)
    assert worst_window([]) is None
    assert Window(0.0, 1.0, 0, 0, 0, 0).success == 1.0


def _samples(limits: list[float], probing: set[int] | None = None) -> list[list[float]]:
    return [[i * 0.2, lim, 0, 0, 1.0, int(i in (probing or set())), 0.0]
            for i, lim in enumerate(limits)]  # fmt: skip


def test_drift_is_the_share_within_the_band_of_the_median() -> None:
    """A limit of 10 with one sample at 13 after the warm-up: 90 % within 20 %; probes apart."""
    limits = [50.0] * 5 + [10.0] * 9 + [13.0]
    d = drift(_samples(limits, {6}), after_s=1.0)
    assert d["median"] == 10.0 and d["n"] == 10
    assert d["within"] == pytest.approx(0.9)
    assert d["steady_within"] == pytest.approx(8 / 9)
    assert d["probe_share"] == pytest.approx(0.1)
    assert (d["min"], d["max"]) == (10.0, 13.0)
    assert drift([], 0.0)["median"] is None


def test_rss_growth_from_the_warm_up_to_the_end() -> None:
    """RSS after the warm-up vs the last sample; fewer than two samples say nothing."""
    rss = [[0.0, 30000], [60.0, 40000], [300.0, 41000], [600.0, 42000]]
    g = rss_growth(rss, 60.0)
    assert (g["start_kb"], g["end_kb"], g["peak_kb"]) == (40000, 42000, 42000)
    assert g["growth"] == pytest.approx(0.05)
    assert rss_growth(rss, 700.0)["growth"] is None


def test_limit_at_and_reaction_after_an_event() -> None:
    """The limit in force at a time; the first sample 20 % below it after the event."""
    samples = _samples([13, 13, 13, 13, 12, 11, 10, 4, 13])
    assert limit_at(samples, 0.6) == 13
    assert limit_at(samples, -1.0) is None
    assert reaction_s(samples, 0.5) == pytest.approx(1.2 - 0.5)
    assert reaction_s(_samples([13, 13, 12]), 0.1) is None
    assert reaction_s([], 0.0) is None
