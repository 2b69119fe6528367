"""One experiment run: a fresh simulator and gateway, one open-loop load, samples.

The simulator is pinned to CPU 0 together with this process (the generator),
the gateway (or a peer in its place: HAProxy or nginx, ``_harness/peers.py``)
to CPU 1 alone (``taskset`` via ``_harness.procs.Procs``). While the
load runs, ``/snapshot`` of the gateway's admin port is sampled every
``SAMPLE_PERIOD_S`` (limit, in-flight, queue depth, and how long the answer
took: the gateway's event-loop lag plus a little of ours; a peer has no
snapshot), and the backend changes of the spec are applied through the
simulator's ``POST /profile`` at their times. CPU of the gateway (or peer)
and the simulator come from ``/proc``, and so does the gateway's peak RSS
(``VmHWM``) at the end of the run.

The generator runs each load at ``SCHED_FIFO`` (``_harness.cpu.realtime``)
with its keep-alive connections opened before the first send and the cyclic
GC paused (``LoadConfig.warm_connections``, ``pause_gc``), so that its own
stalls do not show up as schedule lag; ``docs/instruments.md`` has the
measurements behind each choice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from ballast_tools.loadgen.report import summarize
from ballast_tools.loadgen.runner import LoadConfig, LoadRunner
from ballast_tools.loadgen.schedule import Schedule, make_path_tiers, make_tiers
from experiments._harness.cpu import (
    busy_all,
    cpu_s,
    cpu_ticks,
    favour,
    realtime,
    status_kb,
    steal_all,
    steal_ticks,
)
from experiments._harness.jsonio import get_json, post_json, wait_ok
from experiments._harness.peers import Peer, is_peer, parse_peer, start_peer
from experiments._harness.procs import Procs
from experiments._harness.servers import Target, start_gateway, start_sim
from experiments.sweep.plan import (
    BURST,
    CAPACITY_1X_RPS,
    DEADLINES_S,
    FAST_MS,
    HETERO_1X_RPS,
    HETERO_CLASSES,
    MIX,
    QUIET_RPS,
    QUIET_S,
    SLOW_MS,
    RunSpec,
    parse_limiter,
    sim_paths,
)

SAMPLE_PERIOD_S = 0.2
#: The generator waits this long past a request's deadline before it gives up
#: and closes the connection. A late answer is classified exactly like a
#: timeout (expired), but a closed connection costs the next request a fresh
#: connect on both sides: at 12x with the gateway's loop behind by 100 ms and
#: more, a 50 ms grace made the generator open 28,000 connections in 24 s.
GRACE_S = 0.5
#: Keep-alive connections opened before the first send: 100 ms of the offered rate.
WARM_S, WARM_MAX = 0.1, 512
GATEWAY_CPU, SIM_CPU, GENERATOR_CPU = 1, 0, 0
Progress = Callable[[float], None]


def gateway_yaml(spec: RunSpec) -> str:
    """The gateway config of ``spec``: everything default except the limiter and early drop,
    and no drain on SIGTERM (``server.drain_grace_ms: 0``: the run is measured and its load
    over by then; the default 5 s of health 503 only delayed each run's end)."""
    algorithm, fixed = parse_limiter(spec.limiter)
    blind = algorithm.endswith("-blind")  # e.g. gradient-blind: the loop lag left in (ADR 0010)
    one = algorithm == "gradient-one"  # one limit, one floor: the gradient before ADR 0016
    algorithm = "gradient" if one else algorithm.removesuffix("-blind")
    lines = ["limiter:", f"  algorithm: {algorithm}"]
    if blind:
        lines.append("  subtract_loop_lag: false")
    if one:
        lines += ["  partition_by_route: false", "  gradient:", "    route_baselines: false"]
    if fixed is not None:
        lines.append(f"  fixed_limit: {fixed}")
    lines += ["admission:", f"  early_drop: {str(spec.early_drop).lower()}"]
    lines += ["server:", "  drain_grace_ms: 0"]
    return "\n".join(lines) + "\n"


async def sample_snapshots(
    http: aiohttp.ClientSession, url: str, t0: float, out: list[list[float]]
) -> None:
    """Append ``[t_s, limit, inflight, queue_total, answer_ms, probing, loop_lag_ms]`` per period.

    ``loop_lag_ms`` is the gateway's own loop-lag estimate (ADR 0010; -1 when off).
    """
    while True:
        sent = time.monotonic()
        snap = await get_json(http, url)
        answer_ms = (time.monotonic() - sent) * 1e3
        if snap is not None:
            lim = snap.get("limiter", {})
            queue = snap.get("queue", {}).get("total", 0)
            probing = int(lim.get("algorithm_state", {}).get("state") == "probing")
            lag = lim.get("loop_lag_s")
            lag_ms = -1.0 if lag is None else round(lag * 1e3, 2)
            out.append([round(sent - t0, 3), lim.get("limit", 0), lim.get("inflight", 0),
                        queue, round(answer_ms, 2), probing, lag_ms])  # fmt: skip
        await asyncio.sleep(max(0.0, SAMPLE_PERIOD_S - (time.monotonic() - sent)))


async def apply_events(http: aiohttp.ClientSession, url: str, spec: RunSpec, t0: float) -> None:
    """POST each profile update of ``spec`` at its time after ``t0``."""
    for at_s, update in spec.events:
        await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
        await post_json(http, url, update)


async def show_progress(runner: LoadRunner, progress: Progress) -> None:
    """Report the load's elapsed seconds once a second."""
    while True:
        progress(runner.elapsed_s)
        await asyncio.sleep(1.0)


def _load_config(spec: RunSpec, target: str) -> LoadConfig:
    if spec.scenario in ("hetero", "quiet"):
        quiet = spec.scenario == "quiet"  # no deadline that the burst could miss: it is timed
        tiers = make_path_tiers([(p, share, (30.0 if quiet else d) * spec.k)
                                 for p, _, share, _, d in HETERO_CLASSES], MIX)  # fmt: skip
    else:
        tiers = make_tiers(MIX, [d * spec.k for d in DEADLINES_S])
    warm = min(WARM_MAX, int(spec.rate_rps * WARM_S))
    return LoadConfig(target=target, rate_rps=spec.rate_rps, duration_s=spec.duration_s,
                      seed=spec.seed, tiers=tiers, grace_s=GRACE_S * spec.k,
                      warm_connections=warm)  # fmt: skip


def quiet_schedule(config: LoadConfig) -> Schedule:
    """A quiet spell (one fast request every 1 / ``QUIET_RPS`` s), then ``BURST`` slow at once."""
    tiers = config.tiers
    fast = next(i for i, t in enumerate(tiers) if t.name == "standard:/fast")
    slow = next(i for i, t in enumerate(tiers) if t.name == "standard:/slow")
    n = int(QUIET_S * QUIET_RPS)
    offsets = [i / QUIET_RPS for i in range(n)] + [QUIET_S] * BURST
    return Schedule(offsets, [fast] * n + [slow] * BURST, tiers, config.duration_s)


def peer_of(spec: RunSpec) -> Peer:
    """The peer of a ``haproxy-N`` / ``nginx-N`` run: HAProxy's queue timeout is the shortest
    deadline, nginx's rate the scenario's 1x (both x k / k like the rest of the run)."""
    shortest = min([*DEADLINES_S, *(c[4] for c in HETERO_CLASSES)])
    one_x = HETERO_1X_RPS if spec.scenario in ("hetero", "quiet") else CAPACITY_1X_RPS
    peer = parse_peer(spec.limiter, queue_timeout_s=shortest, rate_rps=one_x)
    return replace(peer, queue_timeout_s=peer.queue_timeout_s * spec.k, rate_rps=one_x / spec.k)


async def drive(
    spec: RunSpec, sim: Target, gw: Target | None, progress: Progress, peer: Target | None = None
) -> dict[str, Any]:
    """Run the load against a started pair (``gw`` and ``peer`` None: the simulator directly).

    ``peer``: HAProxy or nginx in the gateway's place (measured as the gateway,
    no ``/snapshot`` samples).
    """
    samples: list[list[float]] = []
    front = gw or peer
    pids = {"gateway": front.pid if front and front.pid else 0, "sim": sim.pid}
    async with aiohttp.ClientSession() as http:
        await wait_ok(http, f"{sim.admin}/health")
        if gw is not None:
            await wait_ok(http, f"{gw.admin}/health")
        config = _load_config(spec, f"{(front or sim).base}/")
        schedule = quiet_schedule(config) if spec.scenario == "quiet" else None
        runner = LoadRunner(config, schedule)

        def beside(t0: float) -> list[Coroutine[Any, Any, None]]:
            helpers = [
                apply_events(http, f"{sim.admin}/profile", spec, t0),
                show_progress(runner, progress),
            ]
            if gw is not None:
                helpers.append(sample_snapshots(http, f"{gw.admin}/snapshot", t0, samples))
            return helpers

        result, cost = await measured(runner, pids, beside)
        rss = {name: status_kb(pid, "VmHWM") for name, pid in pids.items() if pid}
        sim_stats = await get_json(http, f"{sim.admin}/stats")
    return {
        "spec": _spec_doc(spec),
        "summary": summarize(result),
        "samples": samples,
        "cpu_share": cost["cpu_share"],
        "rss_peak_kb": rss,
        "cpu_busy": cost["cpu_busy"],
        "cpu_steal": cost["cpu_steal"],
        "wall_s": cost["wall_s"],
        "sim_stats": sim_stats,
    }


async def measured(
    runner: LoadRunner,
    pids: Mapping[str, int | None],
    beside: Callable[[float], list[Coroutine[Any, Any, None]]],
) -> tuple[Any, dict[str, Any]]:
    """Run ``runner`` with ``beside(t0)`` running next to it (cancelled when it ends).

    ``t0`` is when the runner's schedule starts (50 ms after ``run()``). Returns
    the runner's result and what the run cost: each process's share of a CPU
    (``pids``: name -> pid, 0 or None for none), both CPUs' busy and steal shares, the
    wall time.
    """
    cpu0 = {name: cpu_s(pid) for name, pid in pids.items() if pid}
    ticks0, steal0, wall0 = cpu_ticks(), steal_ticks(), time.monotonic()
    tasks = [asyncio.create_task(c) for c in beside(wall0 + 0.05)]
    try:
        result = await runner.run()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    wall = time.monotonic() - wall0
    cpu = {name: (cpu_s(pid) - cpu0[name]) / wall for name, pid in pids.items() if pid}
    return result, {
        "cpu_share": {name: round(v, 3) for name, v in cpu.items()},
        "cpu_busy": busy_all(ticks0),
        "cpu_steal": steal_all(steal0, ticks0),
        "wall_s": round(wall, 2),
    }


def _spec_doc(spec: RunSpec) -> dict[str, Any]:
    return {
        "name": spec.name, "scenario": spec.scenario, "limiter": spec.limiter,
        "label": spec.label, "load_x": spec.load_x, "rate_rps": spec.rate_rps,
        "duration_s": spec.duration_s, "k": spec.k, "workers": spec.workers,
        "events": [list(e) for e in spec.events], "early_drop": spec.early_drop,
        "seed": spec.seed, "rep": spec.rep,
    }  # fmt: skip


async def run_one(spec: RunSpec, work: Path, progress: Progress) -> dict[str, Any]:
    """Start the simulator and the gateway (or the peer) for ``spec``, drive it, stop by PID."""
    procs = Procs(work)
    try:
        sim = start_sim(
            procs, SIM_CPU, name=f"{spec.name}-sim", workers=spec.workers,
            fast_ms=FAST_MS * spec.k, slow_ms=SLOW_MS * spec.k, seed=spec.seed,
            paths=sim_paths(spec),
        )  # fmt: skip
        gw = peer = None
        if is_peer(spec.limiter):
            peer = start_peer(procs, peer_of(spec), sim.port, GATEWAY_CPU)
        elif spec.limiter != "direct":
            gw = start_gateway(
                procs, f"{spec.name}-gateway", sim.base, GATEWAY_CPU, gateway_yaml(spec)
            )
        for target in (sim, gw, peer):
            if target is not None and target.pid:
                favour(target.pid)  # each is its own session (autogroup): see cpu.favour
        with realtime() as policy:
            doc = await drive(spec, sim, gw, progress, peer)
    finally:
        procs.stop_all()
    doc["affinity"] = {"gateway": GATEWAY_CPU, "sim": SIM_CPU, "generator": GENERATOR_CPU}
    doc["generator_policy"] = policy
    return doc
