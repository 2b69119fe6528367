"""``python -m experiments.canary``: the canary experiment in one command.

    python -m experiments.canary            # simulation (300 trials) + live run, docs/canary.md
    python -m experiments.canary --trials 50 --no-live   # a quick look, writes runs/ only
    python -m experiments.canary --fr-trials 3000        # 3,000 trials per false-rollback cell
    python -m experiments.canary --fr-trials 3000 --fr-trials-for independent=300
                                 # 300 in the independent cells (bounded by the theorem)

The simulation is pure and seeded (two worker processes); the live run
starts two simulators and the gateway on loopback (``live.py``).
Raw results go to ``runs/canary-<time>/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shlex
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from experiments.canary import empirical_null, report, sim
from experiments.canary.model import NONE

ROOT = Path(__file__).resolve().parents[2]


def _job(args: tuple[Any, Any, int, int]) -> list[sim.Result]:
    cell, reg, trials, seed = args
    return sim.run_cell(cell, reg, trials, seed)


PlanKey = tuple[str, bool | None, int | None]


def parse_plan(items: Sequence[str]) -> dict[PlanKey, int]:
    """``MODEL[+outage|-outage][:RPS]=N`` items (e.g. ``independent=300``) as a dict."""
    plan: dict[PlanKey, int] = {}
    for item in items:
        key, _, n = item.partition("=")
        model, _, rps = key.partition(":")
        model, sign, rest = model.partition("+") if "+" in model else model.partition("-")
        outage = None if not sign else sign == "+"
        ok = model in sim.MODELS and n.isdigit() and (not rps or rps.isdigit())
        if not ok or (sign and rest != "outage"):
            raise SystemExit(
                f"--fr-trials-for: expected MODEL[+outage|-outage][:RPS]=N, got {item!r}"
            )
        plan[(model, outage, int(rps) if rps else None)] = int(n)
    return plan


def trials_for(cell: Any, default: int, plan: dict[PlanKey, int]) -> int:
    """Trials of one false-rollback cell: the most specific plan entry, else ``default``."""
    for key in ((cell.model, cell.outage, cell.rps), (cell.model, cell.outage, None),
                (cell.model, None, cell.rps), (cell.model, None, None)):  # fmt: skip
        if key in plan:
            return plan[key]
    return default


def simulate_all(
    trials: int, seed: int, workers: int, fr_trials: int,
    plan: dict[PlanKey, int] | None = None,
    partial: Path | None = None,
) -> list[sim.Result]:  # fmt: skip
    """Every cell of both grids (``fr_trials`` per false-rollback cell, or ``plan``'s)."""
    jobs = [(c, NONE, trials_for(c, fr_trials, plan or {}), seed) for c in sim.h0_cells()]
    jobs += [(c, r, trials, seed) for c, r in sim.h1_cells()]
    results: list[sim.Result] = []
    with ProcessPoolExecutor(workers) as pool:
        for i, out in enumerate(pool.map(_job, jobs)):
            results.extend(out)
            if partial is not None:  # what ran so far (fr_report reads it if the run is cut)
                partial.write_bytes(pickle.dumps(results))
            print(f"\rsimulation: cell {i + 1}/{len(jobs)}", end="", flush=True)
    print()
    return results


def _explore(args: argparse.Namespace, out: Path) -> list[empirical_null.Row]:
    """The empirical-null variants (reused from ``--reuse`` when that run has them)."""
    saved = args.reuse / "empirical_null.pkl" if args.reuse is not None else None
    if saved is not None and saved.exists():
        rows: list[empirical_null.Row] = pickle.loads(saved.read_bytes())
    elif args.explore:
        rows = empirical_null.explore(empirical_null.TRIALS, args.seed)
    else:
        return []
    (out / "empirical_null.pkl").write_bytes(pickle.dumps(rows))
    return rows


def _provenance(
    args: argparse.Namespace,
    argv: Sequence[str] | None,
    live_started: tuple[str, tuple[float, float, float]] | None,
) -> str:
    """How this report was made when it was not one plain run of the quoted command."""
    if args.reuse is None and args.live_from is None:
        return ""
    this = "python -m experiments.canary " + shlex.join(argv if argv is not None else sys.argv[1:])
    parts = [f"*This report* was written by `{this}`, which reused the simulation of "
             f"`{args.reuse or args.live_from}` (the command above)"]  # fmt: skip
    if live_started is not None:
        when, load = live_started
        parts.append(f" and ran the live rows itself from {when} (load average "
                     f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} at their start)")  # fmt: skip
    elif args.live_from is not None:
        parts.append(f"; the live rows are those of `{args.live_from}`")
    return "".join(parts) + "."


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulation (and the live run), write the raw results and the report."""
    p = argparse.ArgumentParser(prog="python -m experiments.canary")
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--fr-trials", type=int, default=None,
                   help="trials per false-rollback cell, all 96 (default: --trials)")  # fmt: skip
    p.add_argument("--fr-trials-for", action="append", default=[],
                   metavar="MODEL[+outage|-outage][:RPS]=N",
                   help="trials for some false-rollback cells, e.g. independent=300")  # fmt: skip
    p.add_argument("--explore", action="store_true",
                   help="also run the empirical-null variants (empirical_null.py)")  # fmt: skip
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-live", action="store_true", help="skip the live gateway run")
    p.add_argument("--live-good-seconds", type=float, default=600.0,
                   help="how long the identical canary runs live (600)")  # fmt: skip
    p.add_argument("--live-history-ms", type=int, default=30_000,
                   help="the live gateway's sequential.history.history_ms (30000)")  # fmt: skip
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--reuse", type=Path, default=None, help="a runs/canary-* dir: skip the sim")
    p.add_argument(
        "--sim-command",
        default=None,
        help="with --reuse: the command that ran the simulation (quoted in the docs)",
    )
    p.add_argument("--live-from", type=Path, default=None,
                   help="a runs/canary-* dir: reuse its live run")  # fmt: skip
    p.add_argument("--docs", type=Path, default=ROOT / "docs" / "canary.md")
    args = p.parse_args(argv)
    out = args.out or ROOT / "runs" / time.strftime("canary-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if args.reuse is not None:
        results, sim_s, sweep = pickle.loads((args.reuse / "results.pkl").read_bytes())
    else:
        results = simulate_all(args.trials, args.seed, args.workers, args.fr_trials or args.trials,
                               parse_plan(args.fr_trials_for), out / "partial.pkl")  # fmt: skip
        sweep = sim.cap_sweep(args.trials, args.seed)
        sim_s = time.monotonic() - started
    (out / "results.pkl").write_bytes(pickle.dumps((results, sim_s, sweep)))
    args.trials = max((len(r.times) for r in results if r.regression != "none"), default=0)
    explored = _explore(args, out)
    live: dict[str, Any] | None = None
    live_started: tuple[str, tuple[float, float, float]] | None = None
    if args.live_from is not None:
        live = json.loads((args.live_from / "results.json").read_text())["live"]
    elif not args.no_live:
        from experiments.canary import live as live_run

        live_started = (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.getloadavg())
        live = live_run.run_all(args.live_good_seconds, args.live_history_ms)
    doc = {"trials": args.trials, "fr_trials": sim.fr_trials(results), "seed": args.seed,
           "simulation_s": sim_s, "live": live,
           "results": [r.as_dict() for r in results],
           "cap_sweep": [report.sweep_dict(r) for r in sweep],
           "empirical_null": [asdict(r) | {"pp5_median_s": {f"{k[0]} rps, {k[1]}": v
                              for k, v in r.pp5_median_s.items()}} for r in explored]}  # fmt: skip
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    command = " ".join(["python -m experiments.canary", *(argv if argv is not None else
                                                          sys.argv[1:])])  # fmt: skip
    if args.reuse is not None:
        command = args.sim_command or command
    text = report.render(results, sweep, live, trials=args.trials, seed=args.seed, sim_s=sim_s,
                         explored=explored, command=command,
                         provenance=_provenance(args, argv, live_started))  # fmt: skip
    (out / "canary.md").write_text(text)
    if args.trials >= 300 and live is not None:
        args.docs.write_text(text)
        print(f"wrote {args.docs}")
    print(report.summary(results))
    print(f"raw results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
