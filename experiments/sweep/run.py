"""``make experiment``: the load sweep, the degrading upstream, the capacity swing, and
heterogeneous endpoints (table 4, issue 28: three endpoint classes, and a quiet spell
then a burst of slow requests).

    python -m experiments.sweep                 # full: 3 x 108 runs, 1.5-2 h, docs/results.md
    python -m experiments.sweep --only hetero,quiet --reps 1   # table 4 alone, ~8 min
    python -m experiments.sweep --reps 1        # one run per cell (~8 min)
    python -m experiments.sweep --quick         # 3 short runs at 12x, k = 4, < 1 min, runs/ only
    python -m experiments.sweep --only swing --limiters gradient,fixed-64 --reps 1   # a subset
    python -m experiments.sweep --only swing --limiters gradient,gradient-blind,fixed-64 --reps 1
    python -m experiments.sweep --dilate 1.5    # time dilation k (default 1: real time)
    python -m experiments.sweep --dilate auto   # the smallest k at which our processes keep up
    python -m experiments.sweep --report-only runs/exp-...   # redraw docs/ from saved raw data
    # the peers beside gradient and the fixed limits, selected tables and loads, 3 repetitions:
    python -m experiments.sweep --only sweep,degrade,swing,hetero --loads 1,4,12,24 \
        --limiters gradient,fixed,peers --no-docs --out runs/exp-peers
    python -m experiments.sweep --report-only runs/exp-peers --merge runs/t4-final

Every run starts a fresh simulator and gateway (pinned, see ``one.py``),
offers an open-loop load from this process (the lean HTTP/1.1 client) and
records the gateway's limit over time. Every cell is run ``--reps`` times
(3 by default), repetitions outermost so configurations alternate; the
tables show the median and the range. The full run is in **real time**
(k = 1). ``--dilate K`` multiplies service times and deadlines by K and
divides rates by K (see ``plan.py``); ``--dilate auto`` measures the smallest
k in 1, 1.5, 2, 3 at which neither the generator (lag p99 > 10 ms or > 0.5 %
not issued) nor the gateway (> 90 % of a core) was the bottleneck.
``--quick`` uses k = 4: it checks the qualitative shape, on a shared machine
that may be busy with other work. Raw data goes to ``runs/exp-*/`` (gitignored).

The peers (issue 32: ``haproxy-16``, ``haproxy-64``, ``haproxy-256``,
``nginx-32``; ``experiments/_harness/peers.py``) run in every table in the
gateway's place. ``--limiters`` takes names and groups (``fixed``, ``peers``,
``haproxy``); ``--loads`` selects the loads of the tables that have several
(sweep, heterogeneous endpoints) and leaves the degrade, swing and quiet
cells alone. A subset run (``--only``, ``--limiters``, ``--loads``) or
``--no-docs`` writes its report next to its raw data; ``--report-only DIR``
redraws ``docs/results.md`` from ``DIR/results.json``, and ``--merge
OTHER[,OTHER]`` adds the cells of other runs that ``DIR`` lacks (or has
fewer repetitions of), marked ``+`` in the tables: measured numbers are never
replaced by fewer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop

from experiments._harness.cpu import favour, pin_self, scheduling_kept
from experiments._harness.machine import machine, versions
from experiments._harness.procs import cancel_on_signals
from experiments.sweep import metrics as em
from experiments.sweep import plan as exp_plan
from experiments.sweep.checks import bottleneck, calibration_ok
from experiments.sweep.metrics import metrics
from experiments.sweep.one import GENERATOR_CPU, run_one
from experiments.sweep.plots import plot_all
from experiments.sweep.report import index, render, write
from experiments.sweep.reps import group, merge, representatives
from experiments.sweep.targets import evaluate

ROOT = Path(__file__).resolve().parents[2]
OVERHEAD_S = 3.0
K_CANDIDATES = (1.0, 1.5, 2.0, 3.0)


class Progress:
    """One line per run: a bar with elapsed / total seconds, then the run's headline."""

    def __init__(self, specs: list[exp_plan.RunSpec]) -> None:
        self.n = len(specs)
        self.i = 0
        self.spec: exp_plan.RunSpec | None = None
        self.t0 = time.monotonic()
        self.total_s = sum(s.duration_s + OVERHEAD_S for s in specs)
        self.tty = sys.stdout.isatty()

    def start(self, spec: exp_plan.RunSpec) -> None:
        self.i += 1
        self.spec = spec
        if not self.tty:
            print(f"[{self.i:2}/{self.n}] {spec.name} ({spec.rate_rps:g} rps, "
                  f"{spec.duration_s:g} s) ...", flush=True)  # fmt: skip

    def update(self, elapsed_s: float) -> None:
        if not self.tty or self.spec is None:
            return
        dur = self.spec.duration_s
        done = min(1.0, elapsed_s / dur)
        bar = "#" * int(done * 20) + "." * (20 - int(done * 20))
        total = time.monotonic() - self.t0
        print(
            f"\r[{self.i:2}/{self.n}] {self.spec.name:<34} [{bar}] {min(elapsed_s, dur):4.0f}"
            f"/{dur:g} s | total {_mmss(total)} / ~{_mmss(self.total_s)}",
            end="",
            flush=True,
        )

    def done(self, doc: dict[str, Any]) -> None:
        m = metrics(doc)
        flags = ", ".join(m["bottleneck"]["flags"]) or "-"
        lim = m["limit"]
        print(f"{chr(13) if self.tty else ''}[{self.i:2}/{self.n}] {doc['spec']['name']:<34} "
              f"critical {m['critical_served']}/{m['critical_sent']} "
              f"p99 {m['critical_p99_ms'] or 0:.0f} ms, served {m['served_total']}, "
              f"limit {em.fmt_range(lim)}, flags {flags}"
              f"{' ' * 10}", flush=True)  # fmt: skip


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


async def run_specs(specs: list[exp_plan.RunSpec], work: Path) -> list[dict[str, Any]]:
    """Run ``specs`` one after the other, saving each raw document."""
    work.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - before any load runs
    progress = Progress(specs)
    docs = []
    for spec in specs:
        progress.start(spec)
        doc = await run_one(spec, work, progress.update)
        (work / f"{spec.name}.json").write_text(json.dumps(doc))
        progress.done(doc)
        docs.append(doc)
    return docs


async def calibrate(work: Path) -> tuple[float, list[dict[str, Any]]]:
    """The smallest k in K_CANDIDATES at which our own processes keep up."""
    notes = []
    for k in K_CANDIDATES:
        print(f"calibrating: k = {k:g}", flush=True)
        specs = [s.dilated(k) for s in exp_plan.calibration_plan()]
        docs = await run_specs(specs, work / f"k{k:g}")
        flags = sorted({f for d in docs for f in bottleneck(d)["flags"]})
        ok = calibration_ok(docs)
        notes.append({"k": k, "verdict": ("kept up" if ok else "too slow") +
                      (f" ({', '.join(flags)})" if flags else "")})  # fmt: skip
        if ok:
            return k, notes
    return K_CANDIDATES[-1], notes


async def experiment(args: argparse.Namespace, out: Path) -> tuple[list[dict[str, Any]], Any]:
    """Calibrate (or take k), run the plan, write raw data, report and plots."""
    cancel_on_signals()
    started = time.monotonic()
    meta: dict[str, Any] = {"machine": machine(), "versions": versions(), "seed": exp_plan.SEED,
                            "out_dir": str(out.relative_to(ROOT) if out.is_relative_to(ROOT)
                                           else out), "command": args.command,
                            "nice": getattr(args, "nice", None)}  # fmt: skip
    if args.dilate == "auto":
        k, meta["calibration"] = await calibrate(out / "calibration")
    else:
        k, meta["calibration"] = (
            float(args.dilate),
            [{"k": float(args.dilate), "verdict": "given, not measured"}],
        )
    meta["k"] = k
    plan = exp_plan.quick_plan() if args.quick else exp_plan.full_plan()
    if args.only:
        plan = [s for s in plan if s.scenario in args.only.split(",")]
    if args.limiters:
        plan = exp_plan.with_limiters(plan, exp_plan.expand_limiters(args.limiters))
    if args.loads:
        plan = select_loads(plan, args.loads)
    meta["reps"] = args.reps
    specs = [s.repeated(r).dilated(k) for r in range(args.reps) for s in plan]
    print(f"time dilation k = {k:g}; {len(plan)} cells x {args.reps} repetitions", flush=True)
    docs = await run_specs(specs, out)
    meta["total_s"] = time.monotonic() - started
    meta["generator_policy"] = ", ".join(sorted({d.get("generator_policy", "-") for d in docs}))
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": docs}))
    report(docs, meta, out, docs_dir=args.docs)
    return docs, meta


#: The scenarios with a load axis, which ``--loads`` selects from.
LOAD_AXIS = ("sweep", "hetero")


def select_loads(plan: list[exp_plan.RunSpec], loads: str) -> list[exp_plan.RunSpec]:
    """The runs of ``plan`` at ``loads`` (``"1,4,12"``) in the sweep and table 4; others kept."""
    wanted = {float(x) for x in loads.split(",")}
    return [s for s in plan if s.scenario not in LOAD_AXIS or s.load_x in wanted]


def merged(
    docs: list[dict[str, Any]], meta: dict[str, Any], others: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``docs`` with the cells of the runs in ``others`` (``DIR[,DIR]``) they lack."""
    meta = {**meta, "merged": []}
    for other in (o for o in others.split(",") if o):
        saved = json.loads((Path(other) / "results.json").read_text())
        docs, cells = merge(docs, saved["runs"], saved["meta"].get("out_dir", other))
        if cells:
            reps = sorted({len(r) for r in group(saved["runs"]).values()})
            meta["merged"].append({"out_dir": saved["meta"].get("out_dir", other),
                                   "date_utc": saved["meta"]["machine"]["date_utc"],
                                   "reps": "/".join(str(r) for r in reps),
                                   "cells": cells})  # fmt: skip
    return docs, meta


def report(docs: list[dict[str, Any]], meta: dict[str, Any], out: Path, *, docs_dir: bool) -> None:
    """Plots and results.md (into docs/ for a full run, else next to the raw data)."""
    targets = evaluate(index(docs), docs)
    img = ROOT / "docs" / "img" if docs_dir else out / "img"
    plot_all(representatives(docs), img)
    text = render(docs, meta, targets)
    write((ROOT / "docs" / "results.md") if docs_dir else (out / "results.md"), text)
    print("\n".join(targets), flush=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.sweep", description=__doc__)
    p.add_argument("--quick", action="store_true", help="3 short runs at 12x (< 1 min)")
    p.add_argument("--dilate", default=None, help="time dilation k (1; quick 4), or 'auto'")
    p.add_argument("--reps", type=int, default=None, help="runs per cell (3; quick 1)")
    p.add_argument("--only", default=None, help="scenarios to run, e.g. sweep,swing")
    p.add_argument(
        "--limiters",
        default=None,
        help="limiters to run, e.g. gradient,fixed-64; groups: fixed, peers, haproxy",
    )
    p.add_argument("--loads", default=None, help="sweep / table 4 loads, e.g. 1,12 (others kept)")
    p.add_argument("--out", default=None, help="raw data directory (default runs/exp-*)")
    p.add_argument("--no-docs", action="store_true", help="full run, but keep docs/ untouched")
    p.add_argument("--report-only", metavar="DIR", help="redraw docs/ from DIR/results.json")
    p.add_argument("--merge", metavar="DIR[,DIR]", default="",
                   help="with --report-only: add other runs' cells that DIR lacks")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; the report goes to docs/ only for a full run without --no-docs.

    The caller's CPU affinity and nice are as they were afterwards.
    """
    with scheduling_kept():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(given)
    args.command = " ".join(["python -m experiments.sweep", *given])
    if args.report_only:
        saved = json.loads((Path(args.report_only) / "results.json").read_text())
        docs, meta = merged(saved["runs"], saved["meta"], args.merge)
        meta["redrawn_by"] = args.command
        report(docs, meta, Path(args.report_only), docs_dir=True)
        return 0
    if args.merge:
        print("--merge goes with --report-only", file=sys.stderr)
        return 2
    args.dilate = args.dilate or ("4" if args.quick else "1")
    args.reps = args.reps or (1 if args.quick else 3)
    args.docs = not (args.quick or args.no_docs or args.only or args.limiters or args.loads)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = (
        Path(args.out)
        if args.out
        else ROOT / "runs" / f"exp-{'quick-' if args.quick else ''}{stamp}"
    )
    out.mkdir(parents=True, exist_ok=True)
    pin_self(GENERATOR_CPU)
    args.nice = favour()
    try:
        uvloop.run(experiment(args, out))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted (every child process was stopped)", file=sys.stderr)
        return 130
    print(f"raw data: {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
