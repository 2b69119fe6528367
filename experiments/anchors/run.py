"""``make experiment-anchors``: the field's published overload scenarios against ballast.

    python -m experiments.anchors             # all four, real lengths, ~30 min, docs/anchors.md
    python -m experiments.anchors --quick          # CI-size smoke (~2 min), runs/ only
    python -m experiments.anchors --only spike,detect --limiters gradient
    python -m experiments.anchors --report-only runs/anchors-...   # redraw docs/anchors.md

1. Spike convergence (Breakwater, OSDI '20): 0.5x -> 1.4x and 0.5x -> 4x.
2. Prioritised shedding (Netflix 2024): bulk x12 for 30 s over steady critical/standard.
3. Long steady overload (limit creep): 10 minutes at 1.2x.
4. Degradation detection (Envoy #7789): 8 workers, p90 50 ms / p99 150 ms, a
   160 s ramp, then 5x slower.

Every run starts a fresh simulator and target, pinned as ``make experiment``
pins them (``experiments/anchors/drive.py``). The report goes to
``docs/anchors.md`` only for a full run of every scenario; otherwise next to
the raw data in ``runs/anchors-*/``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import uvloop

from experiments._harness.cpu import pin_self, scheduling_kept
from experiments._harness.machine import machine, versions
from experiments._harness.procs import cancel_on_signals
from experiments._harness.servers import find_binary
from experiments.anchors import plan as ap
from experiments.anchors.analysis import analyse, targets
from experiments.anchors.drive import run_one
from experiments.anchors.report import render
from experiments.sweep.one import GENERATOR_CPU
from experiments.sweep.report import write

ROOT = Path(__file__).resolve().parents[2]


def select(args: argparse.Namespace) -> tuple[list[ap.AnchorRun], ap.Lengths]:
    """The plan for the command line: lengths, scenarios, limiters."""
    lengths = ap.QUICK if args.quick else ap.FULL
    runs = ap.full_plan(lengths, peers=find_binary("haproxy") is not None)
    if args.only:
        wanted = args.only.split(",")
        unknown = set(wanted) - set(ap.SCENARIOS)
        if unknown:
            raise SystemExit(f"--only: unknown scenario(s) {sorted(unknown)}; "
                             f"choose from {', '.join(ap.SCENARIOS)}")  # fmt: skip
        runs = [r for r in runs if r.scenario in wanted]
    if args.limiters:
        wanted = args.limiters.split(",")
        known = {r.limiter for r in runs}
        unknown = set(wanted) - known
        if unknown:
            raise SystemExit(f"--limiters: {sorted(unknown)} not in the plan; choose from "
                             f"{', '.join(sorted(known))}")  # fmt: skip
        runs = [r for r in runs if r.limiter in wanted]
    return runs, lengths


def headline(doc: dict[str, Any]) -> str:
    """One line per finished run."""
    a, sc = analyse(doc), doc["spec"]["scenario"]
    flags = ", ".join(a["bottleneck"]["flags"]) or "-"
    if sc == "spike":
        t = a["converged_s"]
        text = (
            f"converged {'never' if t is None else f'{t:.1f} s'}, goodput {a['goodput_share']:.0%}"
        )
    elif sc == "priority":
        text = ", ".join(f"{n} {v['spike_share'] or 0:.2%}" for n, v in a["tiers"].items())
    elif sc == "steady":
        text = f"limit within 20 %: {a['drift']['within'] or 0:.1%}, rss {a['rss']['growth']}"
    else:
        text = f"limit after ramp {a['limit_after_ramp']}, converged {a['converged_s']}"
    return f"{doc['spec']['name']}: {text}; flags {flags}"


async def experiment(runs: list[ap.AnchorRun], out: Path) -> list[dict[str, Any]]:
    """Run every spec in order, saving each raw document."""
    cancel_on_signals()
    docs = []
    for i, run in enumerate(runs, 1):
        print(f"[{i:2}/{len(runs)}] {run.name} ({run.duration_s:g} s) ...", flush=True)
        doc = await run_one(run, out, lambda _s: None)
        (out / f"{run.name}.json").write_text(json.dumps(doc))
        print(f"[{i:2}/{len(runs)}] {headline(doc)}", flush=True)
        docs.append(doc)
    return docs


def report(docs: list[dict[str, Any]], meta: dict[str, Any], path: Path) -> None:
    """Write the report and print the targets."""
    write(path, render(docs, meta))
    print("\n".join(targets(docs)), flush=True)
    print(f"report: {path}", flush=True)


def merge(
    base: dict[str, Any], others: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``base``'s runs with each run of ``others`` replacing the one of the same name (or
    added after the last run of its scenario); ``meta["merged"]`` says when those ran."""
    docs = list(base["runs"])
    meta = {**base["meta"], "merged": []}
    for other in others:
        names = []
        for doc in other["runs"]:
            name, sc = doc["spec"]["name"], doc["spec"]["scenario"]
            names.append(name)
            same = [i for i, d in enumerate(docs) if d["spec"]["name"] == name]
            if same:
                docs[same[0]] = doc
                continue
            last = [i for i, d in enumerate(docs) if d["spec"]["scenario"] == sc]
            docs.insert(last[-1] + 1 if last else len(docs), doc)
        m = other["meta"]
        meta["merged"].append({"out_dir": m["out_dir"], "date_utc": m["machine"]["date_utc"],
                               "loadavg": m["machine"]["loadavg"],
                               "loadavg_end": m.get("loadavg_end", []),
                               "total_s": m["total_s"], "runs": names})  # fmt: skip
    return docs, meta


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.anchors", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--quick", action="store_true", help="CI-size lengths (about 2 min)")
    p.add_argument("--only", default=None, help="scenarios: spike,priority,steady,detect")
    p.add_argument("--limiters", default=None, help="rows to run, e.g. gradient,fixed-64")
    p.add_argument("--out", default=None, help="raw data directory (default runs/anchors-*)")
    p.add_argument("--no-docs", action="store_true", help="full run, but keep docs/ untouched")
    p.add_argument("--report-only", metavar="DIR", help="redraw docs/anchors.md from DIR")
    p.add_argument("--merge", metavar="DIR", action="append",
                   help="with --report-only: DIR's runs replace (or join) those of the same "
                        "name, e.g. rows re-run later")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point (the caller's CPU affinity and nice are as they were afterwards)."""
    with scheduling_kept():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.report_only:
        saved = json.loads((Path(args.report_only) / "results.json").read_text())
        extra = [json.loads((Path(d) / "results.json").read_text()) for d in args.merge or ()]
        merged, merged_meta = merge(saved, extra)
        report(merged, merged_meta, ROOT / "docs" / "anchors.md")
        return 0
    runs, lengths = select(args)
    to_docs = not (args.quick or args.no_docs or args.only or args.limiters)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = (
        Path(args.out)
        if args.out
        else ROOT / "runs" / f"anchors-{'quick-' if args.quick else ''}{stamp}"
    )
    out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"machine": machine(), "versions": versions(),
                            "lengths": asdict(lengths), "quick": args.quick,
                            "out_dir": str(out.relative_to(ROOT) if out.is_relative_to(ROOT)
                                           else out)}  # fmt: skip
    pin_self(GENERATOR_CPU)
    started = time.monotonic()
    try:
        docs = uvloop.run(experiment(runs, out))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted (every child process was stopped)", file=sys.stderr)
        return 130
    meta["total_s"] = time.monotonic() - started
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    meta["generator_policy"] = ", ".join(sorted({d.get("generator_policy", "-") for d in docs}))
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": docs}))
    report(docs, meta, (ROOT / "docs" / "anchors.md") if to_docs else (out / "anchors.md"))
    print(f"raw data: {out}", flush=True)
    return 0
