"""One pool run: three instances, a gateway, open-loop load, one instance broken mid-run.

Processes (started by PID, stopped by PID): three ``experiments.pool.faulty``
instances pinned to CPU 0 (with this driver, which runs the generator), the
gateway started as a user would (``uvicorn ballast_asgi.gateway:app`` with
``BALLAST_UPSTREAM=url1,url2,url3`` and ``BALLAST_CONFIG``) pinned to CPU 1.
Instance 0 is the one that breaks. A fresh gateway per run, so no ejection
history carries over; the instances are reused (a killed one is restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ballast_tools.loadgen.runner import LoadConfig, LoadRunner
from experiments._harness.jsonio import get_json, wait_ok
from experiments._harness.procs import HOST, Procs, free_port
from experiments._harness.procs import kill as kill_pid
from experiments.pool import analysis

GATEWAY_CPU, OTHER_CPU = 1, 0
POLL_S = 0.1


@dataclass(frozen=True)
class Timing:
    """A run's phases (seconds) and offered rate."""

    rate_rps: float
    warm_s: float
    break_s: float
    tail_s: float

    @property
    def total_s(self) -> float:
        return self.warm_s + self.break_s + self.tail_s


@dataclass
class Instances:
    """The three upstream instances (ports fixed, processes restartable)."""

    procs: Procs
    ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    running: dict[int, Any] = field(default_factory=dict)
    error_rate: float = 0.0
    sigma: float = 0.5

    def urls(self) -> list[str]:
        return [f"http://{HOST}:{p}" for p in self.ports]

    def ensure(self) -> None:
        """Start every instance that is not running."""
        for i, port in enumerate(self.ports):
            proc = self.running.get(i)
            if proc is None or proc.poll() is not None:
                cmd = [sys.executable, "-m", "experiments.pool.faulty", "--port", str(port),
                       "--seed", str(i + 1), "--error-rate", str(self.error_rate),
                       "--sigma", str(self.sigma)]  # fmt: skip
                self.running[i] = self.procs.start(cmd, OTHER_CPU, port, f"instance-{i}")

    def restart(self, i: int) -> None:
        """Start instance ``i`` again (after ``kill``)."""
        self.ensure()

    def kill(self, i: int) -> None:
        """Hard down: SIGKILL by PID (the port refuses connections from now on)."""
        proc = self.running.pop(i)
        kill_pid(proc)
        self.procs.stop(proc)


async def _fault(http: aiohttp.ClientSession, inst: Instances, fault: str, on: bool) -> None:
    if fault == "down":  # off the loop: the generator must not stall
        await asyncio.to_thread(inst.kill if on else inst.restart, 0)
        return
    url = f"{inst.urls()[0]}/_fault/{fault if on else 'ok'}"
    async with http.post(url) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: {r.status}")


async def _poll(http: aiohttp.ClientSession, url: str, runner: LoadRunner,
                out: list[analysis.Poll]) -> None:  # fmt: skip
    while True:
        snap = await get_json(http, url)
        if snap is not None and snap.get("upstreams"):
            out.append((runner.elapsed_s, [u["requests"] for u in snap["upstreams"]]))
        await asyncio.sleep(POLL_S)


async def _wait_elapsed(runner: LoadRunner, at_s: float) -> float:
    """Wait (polling the generator's clock every 5 ms) until ``at_s`` into the load."""
    for _ in range(int(at_s / 0.005) + 2_000):
        if runner.elapsed_s >= at_s:
            break
        await asyncio.sleep(0.005)
    return runner.elapsed_s


def start_gateway(procs: Procs, inst: Instances, config: str, work: Path) -> tuple[int, Any]:
    """``uvicorn ballast_asgi.gateway:app`` over the three instances."""
    port = free_port()
    path = work / "gateway.yaml"
    path.write_text(config)
    env = {"BALLAST_UPSTREAM": ",".join(inst.urls()), "BALLAST_CONFIG": str(path),
           "BALLAST_LIMITER": "", "BALLAST_FIXED_LIMIT": ""}  # fmt: skip
    cmd = [sys.executable, "-m", "uvicorn", "ballast_asgi.gateway:app", "--host", HOST,
           "--port", str(port), "--no-access-log", "--log-level", "warning"]  # fmt: skip
    return port, procs.start(cmd, GATEWAY_CPU, port, "gateway", env=env)


async def run_once(
    procs: Procs, inst: Instances, config: str, fault: str | None, timing: Timing,
    seed: int, work: Path,
) -> dict[str, Any]:  # fmt: skip
    """One run; the measurements of ``analysis`` plus the generator's own health."""
    inst.ensure()
    port, gw = start_gateway(procs, inst, config, work)
    base = f"http://{HOST}:{port}"
    polls: list[analysis.Poll] = []
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ok(http, f"{base}/_ballast/health")
            runner = LoadRunner(LoadConfig(target=f"{base}/", rate_rps=timing.rate_rps,
                                           duration_s=timing.total_s, seed=seed,
                                           keep_records=True))  # fmt: skip
            load = asyncio.create_task(runner.run())
            poller = asyncio.create_task(_poll(http, f"{base}/_ballast/snapshot", runner, polls))
            fault_s = await _wait_elapsed(runner, timing.warm_s)
            if fault:
                await _fault(http, inst, fault, True)
            end_s = await _wait_elapsed(runner, timing.warm_s + timing.break_s)
            if fault:
                await _fault(http, inst, fault, False)
            result = await load
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            snap = await get_json(http, f"{base}/_ballast/snapshot")
    finally:
        procs.stop(gw)
    return _measure(result, polls, fault_s, end_s, timing, snap)


def _measure(result: Any, polls: list[analysis.Poll], fault_s: float, end_s: float,
             timing: Timing, snap: dict[str, Any] | None) -> dict[str, Any]:  # fmt: skip
    window = analysis.failures(result.records, fault_s, end_s + timing.tail_s)
    whole = analysis.failures(result.records, 0.0, 1e9)
    ups = (snap or {}).get("upstreams", [])
    return {
        **window, **{f"{k}_total": v for k, v in whole.items()},
        "isolation_s": analysis.isolation_s(polls, 0, fault_s, end_s),
        "touched": round(analysis.touched(polls, 0, fault_s, end_s), 4),
        "ejections": [u.get("ejections", 0) for u in ups],
        "unhealthy_probes": [not u.get("healthy", True) for u in ups],
        "generator_cpu_us": round(result.cpu_us_per_request, 1),
        "fault_s": round(fault_s, 3), "end_s": round(end_s, 3), "polls": len(polls),
    }  # fmt: skip
