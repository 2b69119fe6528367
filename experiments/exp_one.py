"""One experiment run: a fresh simulator and gateway, one open-loop load, samples.

The simulator is pinned to CPU 0 together with this process (the generator),
the gateway to CPU 1 alone (``taskset`` via ``bench_procs.Procs``). While the
load runs, ``/snapshot`` of the gateway's admin port is sampled every
``SAMPLE_PERIOD_S`` (limit, in-flight, queue depth, and how long the answer
took: the gateway's event-loop lag plus a little of ours), and the backend
changes of the spec are applied through the simulator's ``POST /profile`` at
their times. CPU of the gateway and the simulator come from ``/proc``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from experiments.bench_procs import HOST, Procs, cpu_s, cpu_ticks, free_port
from experiments.exp_plan import DEADLINES_S, FAST_MS, MIX, SLOW_MS, RunSpec, parse_limiter
from loadgen.report import summarize
from loadgen.runner import LoadConfig, LoadRunner
from loadgen.schedule import make_tiers

SAMPLE_PERIOD_S = 0.2
GATEWAY_CPU, SIM_CPU, GENERATOR_CPU = 1, 0, 0
READY_TIMEOUT_S = 20.0
Progress = Callable[[float], None]


def gateway_yaml(spec: RunSpec) -> str:
    """The gateway config of ``spec``: everything default except the limiter and early drop."""
    algorithm, fixed = parse_limiter(spec.limiter)
    lines = ["limiter:", f"  algorithm: {algorithm}"]
    if fixed is not None:
        lines.append(f"  fixed_limit: {fixed}")
    lines += ["admission:", f"  early_drop: {str(spec.early_drop).lower()}"]
    return "\n".join(lines) + "\n"


def sim_cmd(spec: RunSpec, port: int, admin: int) -> list[str]:
    """The simulator's command line (service times dilated by k)."""
    return [
        *(sys.executable, "-m", "upstream_sim", "--host", HOST),
        *("--port", str(port), "--admin-port", str(admin), "--workers", str(spec.workers)),
        *("--fast", f"{FAST_MS * spec.k:g}ms", "--slow", f"{SLOW_MS * spec.k:g}ms"),
        *("--seed", str(spec.seed)),
    ]


def gateway_cmd(config: Path, upstream: str, port: int, admin: int) -> list[str]:
    """The gateway's command line (the CLI with a YAML config)."""
    return [
        *(sys.executable, "-m", "ballast_asgi.cli", "--upstream", upstream, "--host", HOST),
        *("--port", str(port), "--admin-port", str(admin), "--config", str(config)),
    ]


async def wait_ok(http: aiohttp.ClientSession, url: str) -> None:
    """Poll ``url`` (bounded) until it answers 200."""
    give_up = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < give_up:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with http.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {READY_TIMEOUT_S:.0f} s")


async def get_json(http: aiohttp.ClientSession, url: str) -> dict[str, Any] | None:
    """GET ``url`` as a JSON object, None on any failure."""
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
            data = await r.json()
            return data if isinstance(data, dict) else None
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None


async def sample_snapshots(
    http: aiohttp.ClientSession, url: str, t0: float, out: list[list[float]]
) -> None:
    """Append ``[t_s, limit, inflight, queue_total, answer_ms, probing]`` every period."""
    while True:
        sent = time.monotonic()
        snap = await get_json(http, url)
        answer_ms = (time.monotonic() - sent) * 1e3
        if snap is not None:
            lim = snap.get("limiter", {})
            queue = snap.get("queue", {}).get("total", 0)
            probing = int(lim.get("algorithm_state", {}).get("state") == "probing")
            out.append([round(sent - t0, 3), lim.get("limit", 0), lim.get("inflight", 0),
                        queue, round(answer_ms, 2), probing])  # fmt: skip
        await asyncio.sleep(max(0.0, SAMPLE_PERIOD_S - (time.monotonic() - sent)))


async def apply_events(http: aiohttp.ClientSession, url: str, spec: RunSpec, t0: float) -> None:
    """POST each profile update of ``spec`` at its time after ``t0``."""
    for at_s, update in spec.events:
        await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
        async with http.post(url, data=json.dumps(update)) as r:
            if r.status != 200:
                raise RuntimeError(f"profile update {update} failed: {r.status}")


async def show_progress(runner: LoadRunner, progress: Progress) -> None:
    """Report the load's elapsed seconds once a second."""
    while True:
        progress(runner.elapsed_s)
        await asyncio.sleep(1.0)


def _load_config(spec: RunSpec, target: str) -> LoadConfig:
    tiers = make_tiers(MIX, [d * spec.k for d in DEADLINES_S])
    return LoadConfig(target=target, rate_rps=spec.rate_rps, duration_s=spec.duration_s,
                      seed=spec.seed, tiers=tiers)  # fmt: skip


async def drive(
    spec: RunSpec, ports: dict[str, int], pids: dict[str, int], progress: Progress
) -> dict[str, Any]:
    """Run the load against a started pair; return the raw result document."""
    samples: list[list[float]] = []
    sim_admin = f"http://{HOST}:{ports['sim_admin']}"
    async with aiohttp.ClientSession() as http:
        await wait_ok(http, f"{sim_admin}/health")
        await wait_ok(http, f"http://{HOST}:{ports['gw_admin']}/health")
        runner = LoadRunner(_load_config(spec, f"http://{HOST}:{ports['gw']}/"))
        cpu0 = {name: cpu_s(pid) for name, pid in pids.items()}
        ticks0, wall0 = cpu_ticks(), time.monotonic()
        t0 = wall0 + 0.05  # the runner starts its schedule 50 ms after run()
        helpers = [
            asyncio.create_task(sample_snapshots(
                http, f"http://{HOST}:{ports['gw_admin']}/snapshot", t0, samples)),
            asyncio.create_task(apply_events(http, f"{sim_admin}/profile", spec, t0)),
            asyncio.create_task(show_progress(runner, progress)),
        ]  # fmt: skip
        try:
            result = await runner.run()
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
        wall = time.monotonic() - wall0
        cpu = {name: (cpu_s(pid) - cpu0[name]) / wall for name, pid in pids.items()}
        ticks1 = cpu_ticks()
        sim_stats = await get_json(http, f"{sim_admin}/stats")
    busy = {
        str(c): round((ticks1[c][0] - ticks0[c][0]) / max(1, ticks1[c][1] - ticks0[c][1]), 3)
        for c in ticks1
    }
    return {
        "spec": _spec_doc(spec),
        "summary": summarize(result),
        "samples": samples,
        "cpu_share": {name: round(v, 3) for name, v in cpu.items()},
        "cpu_busy": busy,
        "wall_s": round(wall, 2),
        "sim_stats": sim_stats,
    }


def _spec_doc(spec: RunSpec) -> dict[str, Any]:
    return {
        "name": spec.name, "scenario": spec.scenario, "limiter": spec.limiter,
        "label": spec.label, "load_x": spec.load_x, "rate_rps": spec.rate_rps,
        "duration_s": spec.duration_s, "k": spec.k, "workers": spec.workers,
        "events": [list(e) for e in spec.events], "early_drop": spec.early_drop,
        "seed": spec.seed,
    }  # fmt: skip


async def run_one(spec: RunSpec, work: Path, progress: Progress) -> dict[str, Any]:
    """Start the simulator and the gateway for ``spec``, drive it, stop both by PID."""
    ports = {name: free_port() for name in ("sim", "sim_admin", "gw", "gw_admin")}
    config = work / f"{spec.name}.yaml"
    config.write_text(gateway_yaml(spec))
    procs = Procs(work)
    try:
        sim = procs.start(sim_cmd(spec, ports["sim"], ports["sim_admin"]), SIM_CPU,
                          ports["sim"], f"{spec.name}-sim")  # fmt: skip
        upstream = f"http://{HOST}:{ports['sim']}"
        gw = procs.start(gateway_cmd(config, upstream, ports["gw"], ports["gw_admin"]),
                         GATEWAY_CPU, ports["gw"], f"{spec.name}-gateway")  # fmt: skip
        doc = await drive(spec, ports, {"gateway": gw.pid, "sim": sim.pid}, progress)
    finally:
        procs.stop_all()
    doc["affinity"] = {"gateway": GATEWAY_CPU, "sim": SIM_CPU, "generator": GENERATOR_CPU}
    return doc


def pin_self(cpu: int = GENERATOR_CPU) -> None:
    """Pin this process (the generator) to ``cpu`` when the machine has more than one."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {cpu})
