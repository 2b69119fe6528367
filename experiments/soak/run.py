"""Soak: the gateway's memory over a long run at 2x the knee (issue 6 target).

    python -m experiments.soak                  # 10 minutes at 500 rps (2x)
    python -m experiments.soak --minutes 2      # a shorter check

Starts the upstream simulator (8 workers, 25 ms / 120 ms, about 264 rps
measured) and the gateway CLI with its default config (gradient limiter) on
free loopback ports, the gateway pinned to CPU 1 and the simulator with this
process (the generator) on CPU 0, as in ``experiments.sweep``. It then offers an
open-loop load (default 500 rps, the reference mix 5/35/60 % critical/
standard/bulk, deadlines 400 ms / 1 s / 3 s) for ``--minutes`` and reads the
gateway's ``VmRSS`` from ``/proc/<pid>/status`` every ``--sample-s`` seconds.

Reported: RSS at the end of the warm-up (the first sample at or after
``--warmup-s``, default 60 s), at the end of the load, the maximum, growth
``100 * (end - warm) / warm`` %, and the least-squares slope of RSS against
time over the samples after warm-up,
``slope = sum((t - t_mean) * (r - r_mean)) / sum((t - t_mean)^2)`` in MB/min.
The target is met when growth <= 5 %. Also the gateway's CPU per sent
request, critical served / sent and the generator's schedule lag p99 (when
that is high, the generator, not the gateway, was the bottleneck). Raw data:
``runs/soak-*/soak.json`` (gitignored). Every process is stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from ballast_tools.loadgen.report import summarize
from ballast_tools.loadgen.runner import LoadConfig, LoadRunner
from ballast_tools.loadgen.schedule import make_tiers
from experiments._harness.cpu import cpu_s, pin_self, status_kb
from experiments._harness.jsonio import get_json, wait_ok
from experiments._harness.loop import HiResLoop
from experiments._harness.procs import Procs, stop_on_signals
from experiments._harness.servers import Target, start_gateway, start_sim
from experiments.soak.analysis import rss_summary
from experiments.sweep.one import GATEWAY_CPU, GENERATOR_CPU, SIM_CPU
from experiments.sweep.plan import DEADLINES_S, MIX

ROOT = Path(__file__).resolve().parents[2]
#: Extra seconds the load may take past its schedule (stragglers) before we give up.
OVERRUN_S = 60.0


async def sample_rss(pid: int, t0: float, period_s: float, out: list[list[float]]) -> None:
    """Append ``[t_s, VmRSS MB]`` of ``pid`` every ``period_s`` (first one at t0)."""
    due = t0
    while True:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        rss_mb = status_kb(pid, "VmRSS") / 1024
        out.append([round(time.monotonic() - t0, 2), round(rss_mb, 2)])
        if len(out) % max(1, round(60 / period_s)) == 0:
            print(f"soak: t={out[-1][0]:6.0f} s  gateway VmRSS {rss_mb:6.1f} MB", flush=True)
        due += period_s


async def drive(args: argparse.Namespace, sim: Target, gw: Target) -> dict[str, Any]:
    """Offer the load to a started pair while sampling RSS; return the raw document."""
    duration_s = args.minutes * 60.0
    samples: list[list[float]] = []
    gw_pid = gw.pid
    assert gw_pid is not None
    cfg = LoadConfig(target=f"{gw.base}/", rate_rps=args.rate,
                     duration_s=duration_s, seed=1, tiers=make_tiers(MIX, DEADLINES_S))  # fmt: skip
    async with aiohttp.ClientSession() as http:
        await wait_ok(http, f"{sim.admin}/health")
        await wait_ok(http, f"{gw.admin}/health")
        rss_start_mb = status_kb(gw_pid, "VmRSS") / 1024
        cpu0, wall0 = cpu_s(gw_pid), time.monotonic()
        t0 = wall0 + 0.05  # the runner starts its schedule 50 ms after run()
        sampler = asyncio.create_task(sample_rss(gw_pid, t0, args.sample_s, samples))
        try:
            async with asyncio.timeout(duration_s + OVERRUN_S):
                result = await LoadRunner(cfg).run()
        finally:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
        gw_cpu_s = cpu_s(gw_pid) - cpu0
        wall_s = time.monotonic() - wall0
        snapshot = await get_json(http, f"{gw.admin}/snapshot")
    summary = summarize(result)
    sent = int(summary["generator"]["sent"])
    return {
        "summary": summary,
        "rss_samples": samples,
        "rss_before_load_mb": round(rss_start_mb, 2),
        "vmhwm_mb": round(status_kb(gw_pid, "VmHWM") / 1024, 2),
        "gateway_cpu_s": round(gw_cpu_s, 3),
        "gateway_cpu_share": round(gw_cpu_s / wall_s, 4),
        "gateway_cpu_us_per_request": round(gw_cpu_s / sent * 1e6, 1) if sent else None,
        "wall_s": round(wall_s, 2),
        "snapshot_after": snapshot,
    }


async def run_soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Start the simulator and the gateway, drive them, stop both by PID."""
    procs = Procs(work)
    try:
        sim = start_sim(procs, SIM_CPU)
        gw = start_gateway(procs, "gateway", sim.base, GATEWAY_CPU)  # every default
        return await drive(args, sim, gw)
    finally:
        procs.stop_all()


def headline(doc: dict[str, Any]) -> dict[str, Any]:
    """The reported figures of one soak document."""
    crit = doc["summary"]["tiers"]["critical"]
    gen = doc["summary"]["generator"]
    return {
        **doc["rss"],
        "gateway_cpu_us_per_request": doc["gateway_cpu_us_per_request"],
        "critical_served": crit["served"],
        "critical_sent": crit["sent"],
        "generator_lag_p99_ms": gen["schedule_lag_ms"]["p99"],
        "generator_sent": gen["sent"],
        "generator_scheduled": gen["scheduled"],
    }


def table(doc: dict[str, Any]) -> str:
    """The markdown table of one soak."""
    h = headline(doc)
    slope = h["slope_mb_per_min"]
    verdict = "**met**" if h["target_met"] else "**missed**"
    cols = ["load", "RSS @ warm-up end MB", "RSS @ end MB", "RSS max MB", "growth",
            "slope MB/min", "gateway CPU us/req", "critical served / sent",
            "generator lag p99", "verdict (growth <= 5 %)"]  # fmt: skip
    head = "| " + " | ".join(cols) + " |"
    sep = "|" + " --- |" * len(cols)
    row = (
        f"| {doc['rate_rps']:,.0f} rps x {doc['minutes']:g} min "
        f"| {h['warm_mb']:.1f} (t={h['warm_t_s']:.0f} s) | {h['end_mb']:.1f} | {h['max_mb']:.1f} "
        f"| {h['growth_pct']:+.1f} % | {'-' if slope is None else f'{slope:+.3f}'} "
        f"| {h['gateway_cpu_us_per_request']:.0f} "
        f"| {h['critical_served']:,} / {h['critical_sent']:,} "
        f"| {h['generator_lag_p99_ms']} ms | {verdict} |"
    )
    return "\n".join([head, sep, row])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.soak", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--minutes", type=float, default=10.0, help="load duration (default 10)")
    p.add_argument("--rate", type=float, default=500.0, help="offered rps (default 500, 2x)")
    p.add_argument("--warmup-s", type=float, default=60.0, help="warm-up excluded (default 60)")
    p.add_argument("--sample-s", type=float, default=5.0, help="RSS sample period (default 5)")
    p.add_argument("--out", type=Path, help="run directory (default runs/soak-<time>)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one soak, write ``soak.json``, print the table."""
    args = _parser().parse_args(argv)
    if args.minutes * 60.0 <= args.warmup_s:
        raise SystemExit("--minutes must be longer than the warm-up")
    work = args.out or ROOT / "runs" / time.strftime("soak-%Y%m%d-%H%M%S", time.gmtime())
    work.mkdir(parents=True, exist_ok=True)
    pin_self(GENERATOR_CPU)
    stop_on_signals()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"soak: {args.rate:g} rps for {args.minutes:g} min; raw data in {work}", flush=True)
    with asyncio.Runner(loop_factory=HiResLoop) as loop:
        doc = loop.run(run_soak(args, work))
    doc.update(started_utc=started, rate_rps=args.rate, minutes=args.minutes,
               warmup_s=args.warmup_s, sample_s=args.sample_s)  # fmt: skip
    doc["rss"] = rss_summary(doc["rss_samples"], args.warmup_s)
    doc["headline"] = headline(doc)
    (work / "soak.json").write_text(json.dumps(doc, indent=1))
    print(table(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
