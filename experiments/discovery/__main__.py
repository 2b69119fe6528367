"""``python -m experiments.discovery``: instances that come and go behind two gateways.

One etcd, two gateways (each with the discovery config and its elected
controller inside), simulator instances that register themselves; 500 rps
(default) split over both gateways with two retries on the route. ``--runs``
runs of ``--run-s`` seconds each carry one churn event (see events.py); a
last run stops etcd for 10 s under the same load. Prints and writes
``runs/discovery/summary.json``:

* requests lost (no 2xx) over all runs, and in the etcd-down run;
* registration -> version applied in both gateways, p50/p99 (and removal);
* config versions written per lease loss.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from ballast_asgi.discovery.etcd import Etcd as EtcdClient
from experiments._harness.procs import processes
from experiments._harness.servers import Target
from experiments.discovery.analysis import Applied, CpuMeter, latencies_ms, merge_history
from experiments.discovery.events import CYCLE, Marks, current_number, fire, flap_alias, pick
from experiments.discovery.load import LoadResult, drive
from experiments.discovery.report import summarize
from experiments.discovery.stack import Etcd, Sim, start_gateway

EVENT_AT_S = 2.0
ALIAS_AT_S = 5.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.discovery", description=__doc__)
    p.add_argument("--runs", type=int, default=40, help="churn runs (default 40)")
    p.add_argument("--run-s", type=float, default=10.0, help="seconds per run (default 10)")
    p.add_argument("--rate", type=float, default=500.0, help="rps over both gateways (500)")
    p.add_argument("--etcd-down-s", type=float, default=10.0, help="etcd stop (default 10 s)")
    p.add_argument("--out", default="runs/discovery", help="output directory (runs/discovery)")
    return p


async def _snapshots(http: aiohttp.ClientSession, gws: list[Target], applied: Applied) -> None:
    for gw in gws:
        async with http.get(gw.admin + "/snapshot") as r:
            merge_history(applied, gw.name, await r.json())


async def _run(
    args: argparse.Namespace, i: int, ctx: dict[str, Any], marks: Marks
) -> dict[str, Any]:
    http, gws, sims, admin = ctx["http"], ctx["gws"], ctx["sims"], ctx["admin"]
    kind = CYCLE[i % len(CYCLE)]
    load = asyncio.ensure_future(drive(http, [g.url for g in gws], args.rate, args.run_s))
    await asyncio.sleep(EVENT_AT_S)
    before = await current_number(admin)
    try:
        what = await fire(kind, i, sims, admin, marks)
    except (RuntimeError, OSError) as exc:  # keep the load running; report the failure
        what = f"{kind} failed: {exc}"
    if kind not in ("lease_loss", "none"):
        alias_of = pick(sims, True, i)
        await asyncio.sleep(max(0.0, ALIAS_AT_S - EVENT_AT_S))
        if alias_of is not None:
            await flap_alias(ctx["etcd_url"], alias_of, i, marks)
    result: LoadResult = await load
    if kind == "lease_loss":
        marks.lease_loss_versions.append(await current_number(admin) - before)
    await _snapshots(http, gws, ctx["applied"])
    row = {"run": i, "kind": kind, "event": what, "sent": result.sent, "lost": result.lost,
           "late": result.late, "failures": dict(result.failures)}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


async def _etcd_down(args: argparse.Namespace, ctx: dict[str, Any], marks: Marks) -> dict[str, Any]:
    http, gws, etcd = ctx["http"], ctx["gws"], ctx["etcd"]
    total_s = args.etcd_down_s + 10.0
    load = asyncio.ensure_future(drive(http, [g.url for g in gws], args.rate, total_s))
    await asyncio.sleep(5.0)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, etcd.stop)
    await asyncio.sleep(args.etcd_down_s)
    await loop.run_in_executor(None, etcd.start)
    restarted = time.time()
    alias_of = pick(ctx["sims"], True, 0)
    if alias_of is not None:
        await flap_alias(ctx["etcd_url"], alias_of, 999, marks, hold_s=2.0)
    result = await load
    await _snapshots(http, gws, ctx["applied"])
    catch_up, _ = latencies_ms(ctx["applied"], marks.registered[-1:], present=True)
    row = {"run": "etcd_down", "sent": result.sent, "lost": result.lost, "late": result.late,
           "failures": dict(result.failures), "etcd_down_s": args.etcd_down_s,
           "register_after_restart_ms": catch_up, "restarted_at": restarted}  # fmt: skip
    print(json.dumps(row), flush=True)
    return row


async def _main(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    with processes(tmp) as procs:
        etcd = Etcd(procs, tmp / "etcd")
        etcd.start()
        sims = [Sim(procs, f"sim{k}", etcd.url) for k in range(4)]
        for sim in sims[:3]:
            sim.start()
        gws = [start_gateway(procs, f"gw{k}", etcd.url) for k in range(2)]
        cpu = CpuMeter({"etcd": [etcd.pid], "gateways": [g.pid for g in gws if g.pid]})
        marks = Marks()
        admin = EtcdClient([etcd.url])
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            ctx: dict[str, Any] = {"http": http, "gws": gws, "sims": sims, "admin": admin,
                                   "etcd": etcd, "etcd_url": etcd.url, "applied": {}}  # fmt: skip
            await _wait_serving(http, gws)
            rows = [await _run(args, i, ctx, marks) for i in range(args.runs)]
            usage = cpu.usage()  # the churn runs (etcd gets a new PID when restarted)
            down = await _etcd_down(args, ctx, marks)
        await admin.aclose()
        return summarize(args, rows, down, marks, ctx["applied"], usage)


async def _wait_serving(http: aiohttp.ClientSession, gws: list[Target]) -> None:
    limit = time.monotonic() + 30
    for gw in gws:
        while True:
            async with http.get(gw.url) as r:
                if r.status == 200:
                    break
            if time.monotonic() > limit:
                raise SystemExit(f"{gw.name} never served (no instances applied?)")
            await asyncio.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    """Run the experiment; print the summary."""
    args = _parser().parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ballast-discovery-") as tmp:
        summary = uvloop.run(_main(args, Path(tmp)))
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary["headline"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
