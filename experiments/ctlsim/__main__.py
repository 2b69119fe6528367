"""``python -m experiments.ctlsim``: the three tables in simulated time.

    python -m experiments.ctlsim                         # every scenario, default limiters
    python -m experiments.ctlsim --only swing --limiters gradient,fixed-64
    python -m experiments.ctlsim --seeds 1,2,3           # median over seeds
    python -m experiments.ctlsim --gateway-us 100,150,200,60   # a gateway that costs CPU

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

from experiments.ctlsim.des import GatewayCpu, Model, summarize
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
    p.add_argument("--only", default="sweep,degrade,swing")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
