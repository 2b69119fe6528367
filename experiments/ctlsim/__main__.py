"""``python -m experiments.ctlsim``: the three tables in simulated time.

    python -m experiments.ctlsim                         # every scenario, default limiters
    python -m experiments.ctlsim --only swing --limiters gradient,fixed-64
    python -m experiments.ctlsim --seeds 1,2,3           # median over seeds
    python -m experiments.ctlsim --gateway-us 100,150,200,60   # a gateway that costs CPU
    python -m experiments.ctlsim --only hetero          # table 4: heterogeneous endpoints

Each cell is the median over ``--seeds`` (the simulator's and the schedule's
seed). Runs the same plans as ``make experiment`` (``experiments.sweep.plan``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from experiments.ctlsim.des import GatewayCpu, Model, burst_makespan, summarize, summarize_classes
from experiments.sweep import plan as exp_plan

DEFAULT_LIMITERS = "fixed-16,fixed-64,fixed-256,gradient,gradient2,vegas"


def cell(spec: exp_plan.RunSpec, seeds: list[int], cpu: GatewayCpu | None = None) -> dict[str, Any]:
    """Median of the headline numbers over ``seeds``."""
    runs = []
    for seed in seeds:
        model = Model(replace(spec, seed=seed), cpu=cpu)
        runs.append(summarize(model, model.run()))
    out: dict[str, Any] = {}
    for key in runs[0]:
        vals = [r[key] for r in runs]
        if isinstance(vals[0], list):
            out[key] = [statistics.median(v) for v in zip(*vals, strict=True)]
        elif all(v is not None for v in vals):
            out[key] = statistics.median(vals)
        else:
            out[key] = None
    out["limit_min"] = min(r["limit_min"] for r in runs)
    out["limit_max"] = max(r["limit_max"] for r in runs)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print the sweep, degrade and swing tables."""
    p = argparse.ArgumentParser(prog="python -m experiments.ctlsim", description=__doc__)
    p.add_argument(
        "--only", default="sweep,degrade,swing", help="any of sweep,degrade,swing,hetero"
    )
    p.add_argument("--limiters", default=DEFAULT_LIMITERS)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--loads", default="1,2,4,8,12")
    p.add_argument("--gateway-us", type=GatewayCpu.parse, default=None,
                   help="gateway CPU microseconds per arrival,forward,response,shed "
                        "(default: a free gateway)")  # fmt: skip
    a = p.parse_args(argv)
    cpu = a.gateway_us
    lims = tuple(a.limiters.split(","))
    seeds = [int(s) for s in a.seeds.split(",")]
    only = a.only.split(",")
    if "sweep" in only:
        loads = tuple(float(x) for x in a.loads.split(","))
        print("sweep: critical p99 ms (critical served / sent)")
        for lim in lims:
            cells = [cell(s, seeds, cpu) for s in exp_plan.sweep(10.0, loads, (lim,))]
            row = "  ".join(f"{c['critical_p99_ms']:6.1f} ({c['critical_served']:.0f}/"
                            f"{c['critical_sent']:.0f})" for c in cells)  # fmt: skip
            print(f"  {lim:<12} {row}")
    for name in ("degrade", "swing"):
        if name not in only:
            continue
        specs = getattr(exp_plan, name)(24.0, lims)
        print(f"{name}: critical served / sent, served total (thirds), limit range")
        for spec in specs:
            c = cell(spec, seeds, cpu)
            print(f"  {spec.limiter:<12} {c['critical_served']:5.0f}/{c['critical_sent']:.0f}"
                  f"  {c['served_total']:7.0f} {c['served_thirds']}"
                  f"  {c['limit_min']}-{c['limit_max']}")  # fmt: skip
    if "hetero" in only:
        hetero(seeds, cpu)
    return 0


#: Table 4's rows: the per-route gradient (the gateway's default, ``-part``), today's
#: one-floor gradient and the fixed limits.
HETERO_ROWS = ("gradient-part", "gradient-one", "fixed-16", "fixed-64", "fixed-256")


def _hetero_cell(spec: exp_plan.RunSpec, seeds: list[int], cpu: GatewayCpu | None) -> Any:
    runs = []
    for seed in seeds:
        model = Model(replace(spec, seed=seed), cpu=cpu)
        runs.append(summarize_classes(model, model.run()))
    out: dict[str, dict[str, float]] = {}
    for cls in runs[0]:
        out[cls] = {
            key: statistics.median(r[cls][key] or 0.0 for r in runs)
            for key in ("served", "sent", "p99_ms", "critical_share")
        }
    return out


def hetero(seeds: list[int], cpu: GatewayCpu | None) -> None:
    """Table 4 in simulated time, with its targets judged on the cells."""
    deadline_ms = {p: d * 1e3 for p, _, _, _, d in exp_plan.HETERO_CLASSES}
    print("hetero: per class served/sent, p99 ms, critical served share")
    verdicts = []
    for x in exp_plan.HETERO_LOADS:
        cells = {}
        for spec in exp_plan.hetero(10.0, (x,), HETERO_ROWS):
            cells[spec.limiter] = c = _hetero_cell(spec, seeds, cpu)
            row = "  ".join(f"{k} {v['served']:.0f}/{v['sent']:.0f} {v['p99_ms']:.0f}ms "
                            f"{v['critical_share']:.1%}" for k, v in c.items())  # fmt: skip
            print(f"  {x:>4g}x {spec.limiter:<14} {row}")
        g = cells["gradient-part"]
        for cls, v in g.items():
            if x <= 1:
                best = max((cells[f][cls] for f in HETERO_ROWS if f.startswith("fixed")),
                           key=lambda m: (m["served"], -m["p99_ms"]))  # fmt: skip
                ok = v["served"] >= 0.97 * best["served"] and v["p99_ms"] <= 1.1 * best["p99_ms"]
                what = (f"{x:g}x {cls}: served {v['served']:.0f} vs best fixed {best['served']:.0f}"
                        f", p99 {v['p99_ms']:.0f} vs {best['p99_ms']:.0f} ms")  # fmt: skip
            else:
                ok = v["critical_share"] >= 0.995 and v["p99_ms"] <= deadline_ms[cls]
                what = (f"{x:g}x {cls}: critical {v['critical_share']:.1%}, p99 "
                        f"{v['p99_ms']:.0f} ms (deadline {deadline_ms[cls]:.0f})")  # fmt: skip
            verdicts.append(f"  {what}: {'met' if ok else 'MISSED'}")
    spans = {}
    for lim in ("gradient-part", "gradient-one", "fixed-16", "fixed-256"):
        model = Model(exp_plan.RunSpec("quiet", lim, 1, 0, exp_plan.QUIET_S + 2, seed=seeds[0]))
        spans[lim] = burst_makespan(model, model.run())
    direct = spans["fixed-256"] or 1.0
    shown = ", ".join(f"{k} {v if v is None else round(v, 3)}" for k, v in spans.items())
    print(f"quiet spell then a burst of 40 slow: seconds to the last answer {shown}")
    g_span = spans["gradient-part"]
    ok = g_span is not None and g_span <= 1.2 * direct
    verdict = "met" if ok else "MISSED"
    verdicts.append(
        f"  quiet burst: gradient {g_span or 0:.3f} s vs direct {direct:.3f} s: {verdict}"
    )
    print("hetero targets (gradient per-route):")
    print("\n".join(verdicts))


if __name__ == "__main__":
    sys.exit(main())
