"""``python -m experiments.canary.fr_report RESULTS.pkl``: the false-rollback grid, as markdown.

For a ``--fr-trials`` run whose detection half did not finish (or any list of
``sim.Result`` pickled): every false-rollback cell of the sequential rule
with its 95 % Wilson interval, the pooled rates, and target 1 stated from
them. Cells absent from the pickle read "not run". Writes
``docs/canary-false-rollbacks.md`` unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import pickle
from collections.abc import Sequence
from pathlib import Path

from experiments.canary import tables
from experiments.canary.sim import Result, fr_trials

ROOT = Path(__file__).resolve().parents[2]


def render(results: list[Result], source: str, note: str = "") -> str:
    """The page: provenance, the verdict, pooled rates per error model, every cell."""
    seq = [r for r in results if r.rule == "sequential" and r.regression == "none"]
    lines = [
        "# Canary: false rollbacks of the sequential rule, every cell with its interval",
        "",
        f"From `{source}`: {tables.fr_plan(seq)} (seed 20261201; at most "
        f"{fr_trials(seq)} per cell), {len(seq)} of the 96 cells (the grid runs in a fixed "
        "order; the cells not reached read 'not run'). Identical canary, 10 simulated "
        "minutes, alpha 0.01; the sequential rule with its warm start (10 minutes of stable "
        "history per trial)." + (f" {note}" if note else ""),
        "",
        tables.fr_verdict(seq),
        "",
        "| error model | cells | rolled back / trials, pooled | worst cell | its rate (95 % CI) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for model in ("independent", "bursty"):
        mine = [r for r in seq if r.cell.model == model]
        if not mine:
            continue
        k, n = sum(r.rolled_back for r in mine), sum(len(r.times) for r in mine)
        worst = max(mine, key=lambda r: r.rate)
        lo, hi = tables._wilson(worst.rolled_back, len(worst.times))
        lines.append(f"| {model} | {len(mine)} | {k} / {n} = {100 * k / n:.2f} % | "
                     f"{tables._cell(worst)} | "
                     f"{100 * worst.rate:.2f} % ({100 * lo:.2f} - {100 * hi:.2f} %) |")  # fmt: skip
    lines += ["", "Every cell: share rolled back (95 % Wilson interval, in %).", ""]
    lines.append(tables.false_rollbacks_by_cell(seq, "sequential"))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Read the pickled results, write the page."""
    p = argparse.ArgumentParser(prog="python -m experiments.canary.fr_report")
    p.add_argument("results", type=Path, help="results.pkl or a pickled Result list")
    p.add_argument("--note", default="", help="a sentence of provenance for the page")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "canary-false-rollbacks.md")
    args = p.parse_args(argv)
    loaded = pickle.loads(args.results.read_bytes())
    # a run's results.pkl holds (results, simulation seconds, cap sweep)
    results: list[Result] = loaded[0] if isinstance(loaded, tuple) else loaded
    source = args.results.name
    args.out.write_text(render(results, source, args.note))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
