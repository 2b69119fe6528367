"""The load generator alone: CPU per request and schedule lag, by client and rate.

    python -m experiments.gencost [--rates 1000,3000,4000] [--seconds 10] [--reps 3]

Starts nginx serving 1 KB (or the simulator with ``--target sim``: 64 workers,
1 ms, so it never queues) pinned to CPU 1, and runs the generator in this
process pinned to CPU 0 with the reference mix (5/35/60 %, 400 ms / 1 s /
3 s): each client (``lean``, ``aiohttp``) at each rate, clients alternating,
``--reps`` times. Prints per cell the median and range over repetitions of
the generator's CPU us per request, its schedule lag p99, and requests not
issued. Every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

from ballast_tools.loadgen.report import summarize
from ballast_tools.loadgen.runner import CLIENTS, LoadConfig, LoadRunner
from experiments._harness.cpu import pin_self
from experiments._harness.loop import HiResLoop
from experiments._harness.procs import processes, stop_on_signals
from experiments._harness.servers import Target, start_backend, start_sim
from experiments._harness.stats import spread

GEN_CPU, TARGET_CPU = 0, 1


def one(target: Target, client: str, rate: float, seconds: float) -> dict[str, Any]:
    """One run of the generator; its own figures from the summary."""
    cfg = LoadConfig(target=target.url, rate_rps=rate, duration_s=seconds, client=client)
    with asyncio.Runner(loop_factory=HiResLoop) as loop:
        s = summarize(loop.run(LoadRunner(cfg).run()))
    g = s["generator"]
    served = sum(t["served"] for t in s["tiers"].values())
    return {
        "client": client,
        "rate": rate,
        "cpu_us": g["cpu_us_per_request"],
        "lag_p99_ms": g["schedule_lag_ms"]["p99"],
        "not_issued": g["not_issued"],
        "served_share": served / max(1, g["scheduled"]),
    }


def cell(rows: list[dict[str, Any]], key: str) -> str:
    """``median (low-high)`` of ``key`` over repetitions."""
    mid, lo, hi = spread(r[key] for r in rows)
    return f"{mid:,.1f} ({lo:,.1f}-{hi:,.1f})"


def table(runs: list[dict[str, Any]], reps: int) -> str:
    """Markdown: one row per client and rate."""
    lines = [
        f"| client | offered rps | CPU us/request | lag p99 ms | not issued | served share "
        f"(median (range) of {reps}) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for client in CLIENTS:
        for rate in sorted({r["rate"] for r in runs}):
            rows = [r for r in runs if r["client"] == client and r["rate"] == rate]
            if rows:
                lines.append(
                    f"| {client} | {rate:,.0f} | {cell(rows, 'cpu_us')} | "
                    f"{cell(rows, 'lag_p99_ms')} | {cell(rows, 'not_issued')} | "
                    f"{cell(rows, 'served_share')} |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the grid and print the table."""
    p = argparse.ArgumentParser(prog="python -m experiments.gencost", description=__doc__)
    p.add_argument("--rates", default="1000,3000", help="offered rates (1000,3000)")
    p.add_argument("--seconds", type=float, default=8.0, help="seconds per run (8)")
    p.add_argument("--reps", type=int, default=3, help="repetitions (3)")
    p.add_argument("--clients", default=",".join(CLIENTS), help="lean,aiohttp")
    p.add_argument("--target", choices=("nginx", "sim"), default="nginx")
    a = p.parse_args(argv)
    pin_self(GEN_CPU)
    stop_on_signals()
    runs = []
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs:
        if a.target == "nginx":
            target, _ = start_backend(procs, TARGET_CPU)
        else:
            target = start_sim(procs, TARGET_CPU, workers=64, fast_ms=1.0, slow_ms=1.0)
        for rep in range(a.reps):
            for rate in (float(x) for x in a.rates.split(",")):
                for client in a.clients.split(","):
                    runs.append(one(target, client, rate, a.seconds))
                    r = runs[-1]
                    print(f"rep {rep} {client:8s} {rate:6.0f} rps: {r['cpu_us']} us/req, lag "
                          f"p99 {r['lag_p99_ms']} ms, not issued {r['not_issued']}, served "
                          f"{100 * r['served_share']:.1f} %", flush=True)  # fmt: skip
    print(table(runs, a.reps))
    return 0
