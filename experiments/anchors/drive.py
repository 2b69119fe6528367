"""One anchor run: a fresh simulator and target, the run's schedule, records and samples.

Pinned as ``make experiment`` pins (``experiments.sweep.one``): the target
(gateway or peer) alone on CPU 1, the simulator and this process (the
generator, at ``SCHED_FIFO`` when permitted) on CPU 0, the simulator and the
target favoured (nice -20 and their autogroups, when permitted: ``cpu.favour``) so
that other work on a shared machine does not starve them. The gateway's config
is the sweep's (``gateway_yaml``: everything default but the limiter, no drain), its
limit is sampled from ``/snapshot`` every 200 ms (``sample_snapshots``), the
backend changes go to the simulator's ``/profile`` (``apply_events``), and
the target's RSS is read from ``/proc`` once a second.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import aiohttp

from ballast_tools.loadgen.report import summarize
from ballast_tools.loadgen.runner import LoadConfig, LoadRunner
from experiments._harness.cpu import (
    favour,
    realtime,
    status_kb,
)
from experiments._harness.jsonio import get_json, wait_ok
from experiments._harness.peers import is_peer, parse_peer, start_peer
from experiments._harness.procs import Procs
from experiments._harness.servers import Target, start_gateway, start_sim
from experiments.anchors.plan import AnchorRun, schedule
from experiments.sweep.one import (
    GATEWAY_CPU,
    GENERATOR_CPU,
    GRACE_S,
    SIM_CPU,
    WARM_MAX,
    WARM_S,
    apply_events,
    gateway_yaml,
    measured,
    sample_snapshots,
)
from experiments.sweep.plan import RunSpec

RSS_PERIOD_S = 1.0
Progress = Callable[[float], None]


def start_target(procs: Procs, run: AnchorRun, sim: Target) -> tuple[Target, str | None]:
    """The target of ``run`` and its admin URL (None for a peer, which has no /snapshot).

    A peer (``haproxy-64``) queues for at most the shortest deadline, as in
    ``make experiment`` (a longer queue timeout serves stale requests under
    overload), and, for nginx, rates non-critical requests at the capacity.
    """
    if is_peer(run.limiter):
        peer = parse_peer(run.limiter, queue_timeout_s=min(run.deadlines_s),
                          rate_rps=run.backend.capacity_rps)  # fmt: skip
        return start_peer(procs, peer, sim.port, GATEWAY_CPU), None
    yaml = gateway_yaml(RunSpec(run.scenario, run.limiter, run.load_x, 0.0, run.duration_s))
    gw = start_gateway(procs, f"{run.name}-gateway", sim.base, GATEWAY_CPU, yaml)
    return gw, gw.admin


async def sample_rss(pid: int, t0: float, out: list[list[float]]) -> None:
    """Append ``[t_s, VmRSS kB]`` of ``pid`` once a second."""
    while True:
        out.append([round(time.monotonic() - t0, 3), status_kb(pid, "VmRSS")])
        await asyncio.sleep(RSS_PERIOD_S)


async def show_progress(runner: LoadRunner, progress: Progress) -> None:
    """Report the load's elapsed seconds once a second."""
    while True:
        progress(runner.elapsed_s)
        await asyncio.sleep(1.0)


def compact(runner: LoadRunner) -> list[list[Any]]:
    """The runner's records as ``[intended_s, tier, outcome, latency_s]`` (latency None if nan)."""
    index = {t.name: i for i, t in enumerate(runner.schedule.tiers)}
    out: list[list[Any]] = []
    for r in runner.records or []:
        lat = None if math.isnan(r.latency_s) else round(r.latency_s, 5)
        out.append([round(r.intended_s, 5), index[r.tier], str(r.outcome), lat])
    out.sort(key=lambda row: row[0])
    return out


async def drive(
    run: AnchorRun, sim: Target, target: Target, admin: str | None, progress: Progress
) -> dict[str, Any]:
    """Offer the run's schedule to ``target``; records, limit samples, RSS, CPU."""
    samples: list[list[float]] = []
    rss: list[list[float]] = []
    pids = {"gateway": target.pid or 0, "sim": sim.pid or 0}
    sched = schedule(run)
    warm = min(WARM_MAX, int(run.peak_rps * WARM_S))
    config = LoadConfig(target=f"{target.base}/", rate_rps=run.peak_rps,
                        duration_s=run.duration_s, seed=run.seed, tiers=sched.tiers,
                        grace_s=GRACE_S, warm_connections=warm, keep_records=True)  # fmt: skip
    async with aiohttp.ClientSession() as http:
        await wait_ok(http, f"{sim.admin}/health")
        if admin is not None:
            await wait_ok(http, f"{admin}/health")
        runner = LoadRunner(config, sched)

        def beside(t0: float) -> list[Coroutine[Any, Any, None]]:
            helpers = [
                apply_events(http, f"{sim.admin}/profile", cast(Any, run), t0),
                show_progress(runner, progress),
            ]
            if pids["gateway"]:
                helpers.append(sample_rss(pids["gateway"], t0, rss))
            if admin is not None:
                helpers.append(sample_snapshots(http, f"{admin}/snapshot", t0, samples))
            return helpers

        result, cost = await measured(runner, pids, beside)
        sim_stats = await get_json(http, f"{sim.admin}/stats")
    return {
        "spec": spec_doc(run),
        "summary": summarize(result),
        "records": compact(runner),
        "samples": samples,
        "rss": rss,
        **cost,
        "sim_stats": sim_stats,
    }


def spec_doc(run: AnchorRun) -> dict[str, Any]:
    """The run as JSON (with the keys the sweep's bottleneck table reads: name, k, events)."""
    return {
        "name": run.name, "scenario": run.scenario, "limiter": run.limiter, "label": run.limiter,
        "load_x": run.load_x, "duration_s": run.duration_s, "k": 1.0, "seed": run.seed,
        "change_s": run.change_s, "deadlines_s": list(run.deadlines_s),
        "capacity_rps": run.backend.capacity_rps, "workers": run.backend.workers,
        "fast_ms": run.backend.fast_ms, "slow_ms": run.backend.slow_ms,
        "events": [list(e) for e in run.events],
        "phases": [[p.duration_s, list(p.start), list(p.end_rates)] for p in run.phases],
        "lengths": asdict(run.lengths),
    }  # fmt: skip


async def run_one(run: AnchorRun, work: Path, progress: Progress) -> dict[str, Any]:
    """Start the simulator and the target for ``run``, drive it, stop both by PID."""
    procs = Procs(work)
    b = run.backend
    try:
        sim = start_sim(procs, SIM_CPU, name=f"{run.name}-sim", workers=b.workers,
                        fast_ms=b.fast_ms, slow_ms=b.slow_ms, seed=run.seed)  # fmt: skip
        target, admin = start_target(procs, run, sim)
        for pid in (sim.pid, target.pid):
            if pid:
                favour(pid)  # each is its own session (autogroup): see cpu.favour
        with realtime() as policy:
            doc = await drive(run, sim, target, admin, progress)
    finally:
        procs.stop_all()
    doc["affinity"] = {"gateway": GATEWAY_CPU, "sim": SIM_CPU, "generator": GENERATOR_CPU}
    doc["generator_policy"] = policy
    return doc
