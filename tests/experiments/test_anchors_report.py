"""``experiments.anchors.analysis`` / ``report``: targets and tables from synthetic runs."""

from __future__ import annotations

from typing import Any

from experiments.anchors import analysis, report
from experiments.anchors import plan as ap
from experiments.anchors.drive import spec_doc


def _doc(run: ap.AnchorRun, records: list[list[Any]], samples: list[list[float]] | None = None,
         rss: list[list[float]] | None = None) -> dict[str, Any]:  # fmt: skip
    """A raw run document as ``drive`` writes it, with a quiet harness (no flags)."""
    return {
        "spec": spec_doc(run),
        "summary": {"generator": {"schedule_lag_ms": {"p99": 1.0}, "not_issued": 0,
                                  "scheduled": len(records), "cpu_us_per_request": 50.0},
                    "tiers": {"critical": {"sent": 1, "not_issued": 0, "served": 1,
                                           "latency_all_ms": {"p99": 50.0},
                                           "latency_served_ms": {"p99": 50.0},
                                           "shed_by_reason": {}}}},
        "records": records, "samples": samples or [[0.0, 13, 8, 0, 1.0, 0, 0.1]],
        "rss": rss or [], "cpu_share": {"gateway": 0.3, "sim": 0.1},
        "cpu_busy": {"0": 0.5, "1": 0.3}, "cpu_steal": {"0": 0.01, "1": 0.0}, "sim_stats": {},
    }  # fmt: skip


def _steady(rate: float, t0: float, t1: float, tier: int = 1, outcome: str = "served",
            latency: float | None = 0.05) -> list[list[Any]]:  # fmt: skip
    n = round((t1 - t0) * rate)
    return [[t0 + i / rate, tier, outcome, latency] for i in range(n)]


def test_spike_target_met_when_the_run_settles_at_once() -> None:
    """A spike run served at 260 rps in time from the step: converged at 0 s, target met."""
    run = ap.spike(ap.QUICK, (4.0,), ("gradient",))[0]
    recs = _steady(125, 0.0, run.change_s) + _steady(260, run.change_s, run.duration_s)
    recs += _steady(700, run.change_s, run.duration_s, outcome="shed", latency=0.001)
    a = analysis.analyse(_doc(run, recs))
    assert a["converged_s"] == 0.0 and not a["collapsed"]
    (row,) = analysis.targets([_doc(run, recs)])[2:]
    assert "1. spike to 4x" in row and row.endswith("**met** |")


def test_spike_target_missed_on_collapse() -> None:
    """Everything late after the step: never converged, collapsed, target missed."""
    run = ap.spike(ap.QUICK, (1.4,), ("gradient",))[0]
    recs = _steady(125, 0.0, run.change_s)
    recs += _steady(350, run.change_s, run.duration_s, outcome="expired", latency=1.5)
    a = analysis.analyse(_doc(run, recs))
    assert a["converged_s"] is None and a["collapsed"]
    assert analysis.targets([_doc(run, recs)])[2].endswith("**missed** |")


def test_priority_target_counts_the_spike_only() -> None:
    """One critical request shed during the spike of 200: 99.5 % < 99.9 %, missed."""
    (run,) = ap.priority(ap.QUICK, ("gradient",))
    end = run.change_s + ap.QUICK.priority_spike_s
    recs = _steady(40, 0.0, run.duration_s, tier=0) + _steady(60, 0.0, run.duration_s)
    recs = [r for r in recs if r[0] != run.change_s] + [[run.change_s, 0, "shed", 0.001]]
    a = analysis.analyse(_doc(run, sorted(recs)))
    crit = a["tiers"]["critical"]
    assert crit["spike"]["offered"] == round(40 * (end - run.change_s))
    assert crit["spike_share"] == 199 / 200
    assert a["tiers"]["standard"]["spike_share"] == 1.0
    assert analysis.targets([_doc(run, sorted(recs))])[2].endswith("**missed** |")


def test_steady_targets_drift_windows_and_memory() -> None:
    """A flat limit, every critical served, RSS +2 %: the three steady targets are met."""
    (run,) = ap.steady(ap.QUICK)
    samples = [[t * 0.2, 13, 13, 0, 1.0, 0, 0.1] for t in range(int(run.duration_s * 5))]
    rss = [[float(t), 40000 + 800 * (t >= 20)] for t in range(int(run.duration_s))]
    recs = _steady(15, 0.0, run.duration_s, tier=0)
    rows = analysis.targets([_doc(run, recs, samples, rss)])[2:]
    assert len(rows) == 3 and all(r.endswith("**met** |") for r in rows)


def test_detect_reads_the_limit_after_the_ramp_and_the_reaction() -> None:
    """Limit 9 at the end of the ramp, halved 0.4 s after the slowdown; served at the slowed
    capacity from then on (the first slowed answers 0.3 s after it): converged at once."""
    (run,) = ap.detect(ap.QUICK)
    ramp, slow = ap.QUICK.detect_ramp_s, run.change_s
    samples = [[t / 5, 9 if t / 5 < slow + 0.4 else 4, 4, 0, 1.0, 0, 0.1]
               for t in range(int(run.duration_s * 5))]  # fmt: skip
    recs = _steady(200, 0.0, slow) + _steady(29, slow, run.duration_s, latency=0.3)
    a = analysis.analyse(_doc(run, recs, samples))
    assert a["limit_after_ramp"] == 9 and a["reaction_s"] == (slow + 0.4 - slow)
    assert a["converged_s"] is not None and a["converged_s"] <= 0.3
    rows = analysis.targets([_doc(run, recs, samples)])[2:]
    assert [r.endswith("**met** |") for r in rows] == [True, True]
    assert ramp < slow


def test_report_names_every_source_and_has_the_four_tables() -> None:
    """The rendered page quotes Breakwater, Netflix, the drift reports and Envoy #7789."""
    run = ap.spike(ap.QUICK, (1.4,), ("gradient",))[0]
    recs = _steady(125, 0.0, run.change_s) + _steady(260, run.change_s, run.duration_s)
    meta = {"machine": {"cores": 2, "cpu_model": "x", "platform": "linux", "loadavg": [1.0],
                        "date_utc": "2026-12-03 12:00:00"},
            "versions": {"python": "3.11"}, "total_s": 60.0, "out_dir": "runs/x",
            "loadavg_end": [1.5], "lengths": vars(ap.QUICK)}  # fmt: skip
    text = report.render([_doc(run, recs)], meta)
    for needle in ("OSDI '20", "DAGOR", "Netflix Technology Blog", "99.4 %", "PR #88",
                   "#38338", "Envoy issue #7789", "## 1. Spike", "## 2. Prioritised",
                   "## 3. Long steady", "## 4. Degradation", "## Bottleneck checks",
                   "load average 1.0 at the start, 1.5 at the end"):  # fmt: skip
        assert needle in text, needle


def test_merge_replaces_rows_of_the_same_name_and_says_when_they_ran() -> None:
    """Rows re-run later replace their namesakes in place; new rows join their scenario."""
    from experiments.anchors.run import merge

    def doc(name: str, scenario: str, tag: str) -> dict[str, Any]:
        return {"spec": {"name": name, "scenario": scenario}, "tag": tag}

    base = {"runs": [doc("spike-gradient-4x", "spike", "a"),
                     doc("spike-haproxy-16-4x", "spike", "a"),
                     doc("steady-gradient-1.2x", "steady", "a")],
            "meta": {"out_dir": "runs/a"}}  # fmt: skip
    later = {"runs": [doc("spike-haproxy-16-4x", "spike", "b"),
                      doc("spike-haproxy-64-4x", "spike", "b")],
             "meta": {"out_dir": "runs/b", "machine": {"date_utc": "2026-12-03 12:30:00",
                                                        "loadavg": [2.0]},
                      "loadavg_end": [3.0], "total_s": 120.0}}  # fmt: skip
    docs, meta = merge(base, [later])
    assert [(d["spec"]["name"], d["tag"]) for d in docs] == [
        ("spike-gradient-4x", "a"), ("spike-haproxy-16-4x", "b"), ("spike-haproxy-64-4x", "b"),
        ("steady-gradient-1.2x", "a")]  # fmt: skip
    assert meta["merged"][0]["runs"] == ["spike-haproxy-16-4x", "spike-haproxy-64-4x"]
    assert meta["out_dir"] == "runs/a"


def test_a_peers_bare_503s_are_its_shedding_but_other_errors_stay_errors() -> None:
    """HAProxy's queue-timeout 503 counts as shed; with another error status, nothing moves."""
    run = ap.spike(ap.QUICK, (4.0,), ("haproxy-16",))[0]
    recs = [[0.1, 2, "error", 0.4], [0.2, 0, "served", 0.05]]
    doc = _doc(run, recs)
    doc["summary"]["tiers"]["critical"]["errors_by"] = {"status:503": 1}
    assert [r[2] for r in analysis.records(doc)] == ["shed", "served"]
    doc["summary"]["tiers"]["critical"]["errors_by"] = {"status:503": 1, "status:502": 1}
    assert [r[2] for r in analysis.records(doc)] == ["error", "served"]
    gateway = _doc(ap.spike(ap.QUICK, (4.0,), ("gradient",))[0], recs)
    gateway["summary"]["tiers"]["critical"]["errors_by"] = {"status:503": 1}
    assert [r[2] for r in analysis.records(gateway)] == ["error", "served"]
