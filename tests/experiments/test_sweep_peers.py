"""The sweep with the peers and 24x (issues 32 and 31): plan, options, merge, tables, targets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.sweep import plan
from experiments.sweep.metrics import flag_text
from experiments.sweep.one import peer_of
from experiments.sweep.report import cpu_table, event_table, index, limit_text, sweep_table
from experiments.sweep.reps import group, merge
from experiments.sweep.run import merged, select_loads
from experiments.sweep.targets import headroom, peers_critical, peers_swing


def _tier(sent: int, served: int, p99_ms: float) -> dict[str, Any]:
    return {"sent": sent, "served": served, "not_issued": 0, "shed_by_reason": {},
            "latency_all_ms": {"p99": p99_ms}, "latency_served_ms": {"p99": p99_ms}}  # fmt: skip


def _doc(scenario: str, label: str, x: float, *, rep: int = 0, crit: int = 100,
         total: int = 1000, p99: float = 150.0, cpu: float = 0.4, rss_kb: int = 80_000,
         lag: float = 1.0) -> dict[str, Any]:  # fmt: skip
    """A minimal raw run document, as ``one.py`` writes it (100 critical, 1000 others sent)."""
    return {
        "spec": {
            "name": f"{scenario}-{label}-{x:g}x-r{rep}",
            "scenario": scenario,
            "label": label,
            "limiter": label,
            "load_x": x,
            "k": 1.0,
            "events": [],
            "rep": rep,
            "duration_s": 3.0,
        },
        "summary": {
            "tiers": {"critical": _tier(100, crit, p99), "bulk": _tier(1000, total - crit, p99)},
            "generator": {
                "schedule_lag_ms": {"p99": lag},
                "not_issued": 0,
                "scheduled": 1100,
                "cpu_us_per_request": 70.0,
            },
            "timeline": [{"critical": {"served": crit}}, {}, {}],
        },
        "samples": [] if label.startswith(("haproxy", "nginx")) else [[0.0, 10, 5, 0, 1.0, 0]],
        "cpu_share": {"gateway": cpu, "sim": 0.1},
        "rss_peak_kb": {"gateway": rss_kb, "sim": 40_000},
    }


def test_full_plan_runs_the_peers_in_every_table_and_24x_in_the_sweep() -> None:
    """Every peer runs in sweep, degrade, swing and table 4; the sweep goes to 24x for everyone."""
    specs = plan.full_plan()
    for scenario in ("sweep", "degrade", "swing", "hetero"):
        ran = {s.limiter for s in specs if s.scenario == scenario}
        assert set(plan.PEERS) <= ran, scenario
    at24 = {s.limiter for s in specs if s.scenario == "sweep" and s.load_x == 24}
    assert at24 == set(plan.SWEEP_LIMITERS)
    assert next(s for s in specs if s.load_x == 24).rate_rps == 6000


def test_limiter_groups_expand_in_order_without_duplicates() -> None:
    """``gradient,fixed,peers`` names the gradient, the three fixed limits and the four peers."""
    names = plan.expand_limiters("gradient,fixed,peers,fixed-16")
    assert names == ("gradient", *plan.FIXED, *plan.PEERS)
    assert plan.expand_limiters("haproxy") == ("haproxy-16", "haproxy-64", "haproxy-256")


def test_loads_select_the_sweep_and_table_4_and_keep_the_other_scenarios() -> None:
    """``--loads 4,12`` drops sweep/hetero cells at other loads, never degrade/swing/quiet."""
    kept = select_loads(plan.full_plan(), "4,12")
    assert {s.load_x for s in kept if s.scenario in ("sweep", "hetero")} == {4, 12}
    for scenario in ("degrade", "swing", "quiet"):
        assert any(s.scenario == scenario for s in kept)


def test_peer_of_a_run_scales_with_dilation() -> None:
    """HAProxy's queue timeout is the shortest deadline x k; nginx's rate the scenario's 1x / k."""
    spec = plan.sweep(10.0, (12,), ("haproxy-64",))[0].dilated(2.0)
    assert peer_of(spec).queue_timeout_s == 0.8 and peer_of(spec).limit == 64
    hetero = plan.hetero(10.0, (4,), ("nginx-32",))[0]
    assert peer_of(hetero).rate_rps == plan.HETERO_1X_RPS
    variant = plan.sweep(10.0, (12,), ("haproxy-16-q1000",))[0].dilated(2.0)
    assert peer_of(variant).queue_timeout_s == 2.0


def test_merge_never_replaces_measurements_with_fewer() -> None:
    """An older cell with more runs stays; one with as many gives way; missing ones are added."""
    new = [_doc("sweep", "gradient", 12, rep=0), _doc("sweep", "haproxy-16", 12, rep=0)]
    old = [_doc("sweep", "gradient", 12, rep=r, crit=90) for r in range(3)]
    old += [_doc("sweep", "haproxy-16", 12, crit=1), _doc("sweep", "fixed-16", 8)]
    docs, taken = merge(new, old, "runs/old")
    cells = group(docs)
    assert taken == 2
    assert len(cells[("sweep", "gradient", 12)]) == 3
    assert all(d["merged_from"] == "runs/old" for d in cells[("sweep", "gradient", 12)])
    assert "merged_from" not in cells[("sweep", "haproxy-16", 12)][0]
    assert ("sweep", "fixed-16", 8) in cells
    idx = index(docs)
    assert flag_text(idx[("sweep", "gradient", 12)]).endswith(" +")
    assert flag_text(idx[("sweep", "haproxy-16", 12)]) == ""


def test_report_only_merge_reads_other_runs_and_names_them(tmp_path: Path) -> None:
    """``merged`` adds another run's cells and records where they came from."""
    other = tmp_path / "t4"
    other.mkdir()
    saved = {"meta": {"out_dir": "runs/t4", "machine": {"date_utc": "2026-12-03 10:29:00"}},
             "runs": [_doc("hetero", "gradient-one", 4, rep=r) for r in range(3)]}  # fmt: skip
    (other / "results.json").write_text(json.dumps(saved))
    docs, meta = merged([_doc("hetero", "gradient", 4)], {"k": 1.0}, str(other))
    assert len(docs) == 4
    assert meta["merged"] == [{"out_dir": "runs/t4", "date_utc": "2026-12-03 10:29:00",
                               "reps": "3", "cells": 1}]  # fmt: skip


def test_tables_show_24x_peer_rows_and_the_cpu_share() -> None:
    """24x gets a column (no reference), peers a constant limit and their own CPU share."""
    docs = [_doc("sweep", lab, x, cpu=0.3 if lab == "gradient" else 0.05)
            for lab in ("gradient", "haproxy-16") for x in (12, 24)]  # fmt: skip
    idx = index(docs)
    table = sweep_table(idx)
    assert "critical served at 12x" in table[0] and "critical served at 24x" in table[0]
    assert table[2].startswith(
        "| gradient | 150 ms (207) | 150 ms | 100 / 100 (735 / 735) | 100 / 100 |"
    )
    cpu = cpu_table(idx)
    assert cpu[2] == "| gradient | 30% | 30% | 78 MB |"
    assert cpu[3] == "| haproxy-16 | 5% | 5% | 78 MB |"
    assert limit_text("haproxy-64", idx[("sweep", "haproxy-16", 12)]) == "maxconn 64 (constant)"
    assert limit_text("nginx-32", idx[("sweep", "haproxy-16", 12)]) == "max_conns 32 (constant)"


def test_swing_table_shows_critical_served_and_p99_beside_the_total() -> None:
    """Tables 2 and 3 carry both served counts and the critical p99 of every row."""
    idx = index([_doc("swing", "gradient", 6.4, crit=99, total=900),
                 _doc("swing", "haproxy-64", 6.4, crit=100, total=800)])  # fmt: skip
    for key in idx:
        idx[key]["phases"] = [1, 2, 3]
    rows = event_table(idx, "swing")
    assert "critical served" in rows[0] and "critical p99" in rows[0]
    assert "| 99 / 100 | 150 ms |" in rows[2]
    assert "maxconn 64 (constant)" in rows[3]


def test_peer_targets_compare_gradient_with_the_best_haproxy() -> None:
    """Critical served per scenario against the best HAProxy; the swing's total against every."""
    idx = index([_doc("sweep", "gradient", 12, crit=100), _doc("sweep", "haproxy-16", 12, crit=99),
                 _doc("sweep", "haproxy-64", 12, crit=100), _doc("sweep", "nginx-32", 12, crit=100),
                 _doc("swing", "gradient", 6.4, total=900), _doc("swing", "haproxy-64", 6.4,
                                                                   total=950)])  # fmt: skip
    crit = peers_critical(idx)
    assert len(crit) == 2
    assert "gradient 100 vs haproxy-64 100 of 100" in crit[0] and crit[0].endswith("**met** |")
    swing = peers_swing(idx)
    assert "gradient 900 vs haproxy-64 950" in swing[0] and swing[0].endswith("**missed** |")


def test_headroom_at_24x_names_the_ceiling_when_critical_alone_exceeds_capacity() -> None:
    """When critical alone offers more than the backend serves, the line states the ceiling."""
    doc = _doc("sweep", "gradient", 24, crit=80)
    doc["summary"]["tiers"]["critical"] = _tier(3000, 2600, 150.0)
    doc["spec"]["duration_s"] = 10.0
    rows = headroom(index([doc]), [doc])
    assert "critical alone offers 300 rps against the backend's 269" in rows[0]
    assert "no one can serve more than 89.6%" in rows[0]


def test_headroom_targets_at_12x_and_24x() -> None:
    """12x: CPU <= 50 % and all critical; 24x: >= 99.5 % critical, RSS < 256 MB, generator."""
    docs = [_doc("sweep", "gradient", 12, cpu=0.45), _doc("sweep", "gradient", 24, crit=99,
            cpu=0.95, rss_kb=300 * 1024, lag=12.0)]  # fmt: skip
    rows = headroom(index(docs), docs)
    assert len(rows) == 4
    assert "45% of CPU 1, critical 100 / 100" in rows[0] and rows[0].endswith("**met** |")
    assert "99.00%" in rows[1] and rows[1].endswith("**missed** |")
    assert "no one can serve" not in rows[1]  # 100 critical in 3 s fit the backend
    assert "highest 300 MB (gradient)" in rows[2] and rows[2].endswith("**missed** |")
    assert "worst lag p99 12.0 ms" in rows[3] and rows[3].endswith("**missed** |")


def test_header_names_the_command_the_redraw_and_the_merged_runs() -> None:
    """The page says which command measured it, which redrew it, and where + cells came from."""
    from experiments.sweep.report import header

    meta = {
        "machine": {"date_utc": "2026-12-03 12:40:00", "cores": 2, "cpu_model": "x",
                    "platform": "linux", "loadavg": [1.0, 1.0, 1.0]},
        "versions": {"python": "3.11"}, "k": 1.0, "total_s": 600.0, "out_dir": "runs/a", "seed": 1,
        "command": "python -m experiments.sweep --only swing",
        "redrawn_by": "python -m experiments.sweep --report-only runs/a --merge runs/b",
        "merged": [{"out_dir": "runs/b", "date_utc": "2026-12-03 10:29:00", "reps": "3",
                    "cells": 5}],
    }  # fmt: skip
    text = "\n".join(header(meta))
    assert "Generated by `python -m experiments.sweep --only swing`" in text
    assert "redrawn by `python -m experiments.sweep --report-only runs/a --merge runs/b`" in text
    assert "`runs/b` (2026-12-03 10:29:00 UTC, 3 run(s) per cell: 5 cells, marked `+`)" in text
    assert "`haproxy-N` is HAProxy 2.6" in text


def test_others_share_is_what_neither_steal_nor_our_processes_took() -> None:
    """CPU 1 busy 90 % with the gateway at 40 % and no steal: 50 % others (a column, no flag)."""
    from experiments.sweep.checks import bottleneck, others_share

    doc = _doc("sweep", "gradient", 12, cpu=0.4)
    doc.update(cpu_busy={"0": 0.5, "1": 0.9}, cpu_steal={"0": 0.0, "1": 0.0}, wall_s=10.0)
    doc["summary"]["generator"]["cpu_s"] = 2.0  # 20 % of CPU 0, the simulator 10 %
    assert others_share(doc) == {"0": 0.2, "1": 0.5}
    assert bottleneck(doc)["cpu_others"] == {"0": 0.2, "1": 0.5}
    assert bottleneck(doc)["flags"] == []


def test_favour_sets_a_child_s_nice_and_its_autogroup_s(tmp_path: Path) -> None:
    """A child in its own session gets the nice asked for, and so does its autogroup."""
    import os
    import subprocess
    import sys

    from experiments._harness.cpu import autogroup_nice, favour

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             start_new_session=True)  # fmt: skip
    try:
        wanted = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)  # raising nice: no privilege
        assert favour(child.pid, wanted) == wanted
        group = autogroup_nice(child.pid)  # None: no autogroup (a container's cgroup)
        if group is not None:
            assert group == wanted
    finally:
        child.kill()
        child.wait()


def test_scheduling_kept_gives_the_caller_back_its_cpus_and_nice() -> None:
    """A main run in-process pins and favours itself; afterwards its caller is as before."""
    import os

    from experiments._harness.cpu import can_pin, favour, pin_self, scheduling, scheduling_kept

    before = scheduling()
    with scheduling_kept():
        pin_self(0)
        favour()  # nice -20 where permitted, else nothing changes
        if can_pin():
            assert os.sched_getaffinity(0) == {0}
    assert scheduling() == before


def test_an_empty_or_odd_autogroup_file_means_no_autogroup() -> None:
    """In a container the file exists but is empty: "no autogroup", never an error.

    CI's machine is such a container; reading the empty file raised IndexError
    in the autouse scheduling guard, and every test errored.
    """
    from experiments._harness.cpu import parse_autogroup

    assert parse_autogroup("/autogroup-3931 nice 0\n") == 0
    assert parse_autogroup("/autogroup-7 nice -20\n") == -20
    assert parse_autogroup("") is None
    assert parse_autogroup("\n") is None
    assert parse_autogroup("/autogroup-7 nice\n") is None
    assert parse_autogroup("/autogroup-7 nice x\n") is None
