"""Closed-loop saturation: the gateway as a user starts it against the bare pass-through.

Both proxies pinned to CPU 1, nginx (1 KB) and the client on CPU 0. The
gateway is started exactly as a user would: ``uvicorn ballast_asgi.gateway:app``
with ``BALLAST_UPSTREAM`` and every default. The client is ``wrk`` (one
thread, ``--conns`` connections, default 16) when installed (apt-get is tried),
else the raw asyncio closed loop of ``drive.blast``. Runs alternate bare,
gateway, bare, ... ``reps`` times; per run the requests/s and the proxy's CPU
us per request (``/proc/<pid>/stat``); reported as medians with ranges and the
two ratios gateway / bare (CPU per request, and rate).

    python -m experiments.bench.saturation [--seconds 5] [--reps 3] [--conns 16]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments._harness.cpu import cpu_s, pin_self
from experiments._harness.procs import Procs, processes
from experiments._harness.servers import (
    Target,
    ensure_package,
    start_backend,
    start_bare,
    start_uvicorn_gateway,
)
from experiments._harness.stats import spread
from experiments.bench.drive import blast, request_bytes

CPU_LOAD, CPU_PROXY = 0, 1
_RPS = re.compile(rb"Requests/sec:\s+([0-9.]+)")


def _wrk(wrk: str, target: Target, conns: int, seconds: float) -> int:
    """Responses in ``seconds`` of ``wrk -t1 -c conns`` (pinned to the load CPU)."""
    cmd = ["taskset", "-c", str(CPU_LOAD), wrk, "-t1", f"-c{conns}", f"-d{seconds:g}s",
           target.url]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, check=True, timeout=seconds + 30).stdout
    found = _RPS.search(out)
    return round(float(found.group(1)) * seconds) if found else 0


def one(target: Target, wrk: str | None, conns: int, seconds: float, rep: int) -> dict[str, Any]:
    """One closed-loop run; the proxy's CPU per response."""
    assert target.pid is not None
    before, t0 = cpu_s(target.pid), time.monotonic()
    if wrk:
        n = _wrk(wrk, target, conns, seconds)
    else:
        n = blast(target, "sat", request_bytes(target.path, {}), conns, seconds, rep).responses
    wall, used = time.monotonic() - t0, cpu_s(target.pid) - before
    return {"config": target.name, "rep": rep, "responses": n, "rps": n / seconds,
            "cpu_us": used / n * 1e6 if n else float("nan"), "cpu_util": used / wall}  # fmt: skip


def start(procs: Procs) -> tuple[Target, Target, str]:
    """nginx, the bare aiohttp pass-through and the uvicorn-started gateway; a note."""
    backend, note = start_backend(procs, CPU_LOAD)
    bare = start_bare(procs, "aiohttp", backend.port, CPU_PROXY)
    gw = start_uvicorn_gateway(procs, "ballast-uvicorn", backend.base, CPU_PROXY)
    return bare, gw, note


def saturation(procs: Procs, seconds: float, reps: int, conns: int) -> dict[str, Any]:
    """The alternating runs and their summary."""
    wrk = ensure_package("wrk", "wrk")
    bare, gw, note = start(procs)
    for t in (bare, gw):
        one(t, wrk, conns, 1.0, -1)  # warm-up
    runs = []
    for rep in range(reps):
        for t in (bare, gw) if rep % 2 == 0 else (gw, bare):
            runs.append(one(t, wrk, conns, seconds, rep))
            r = runs[-1]
            print(f"  saturation {r['config']:16s} rep {rep}: {r['rps']:8.0f} rps, "
                  f"{r['cpu_us']:6.1f} us/req, proxy CPU {100 * r['cpu_util']:.0f} %",
                  flush=True)  # fmt: skip
    return {"client": f"wrk -t1 -c{conns}" if wrk else f"raw asyncio closed loop, {conns} conns",
            "backend": note, "seconds": seconds, "runs": runs, **summary(runs)}  # fmt: skip


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians (with ranges) per config and the gateway / bare ratios of the medians."""
    out: dict[str, Any] = {}
    for key in ("rps", "cpu_us"):
        for name in ("aiohttp", "uvicorn"):
            rows = [r[key] for r in runs if name in r["config"]]
            out[f"{name}_{key}"] = spread(rows)
    out["cpu_ratio"] = out["uvicorn_cpu_us"][0] / out["aiohttp_cpu_us"][0]
    out["rate_ratio"] = out["uvicorn_rps"][0] / out["aiohttp_rps"][0]
    return out


def table(sat: dict[str, Any]) -> list[str]:
    """Markdown lines for the report."""

    def cell(v: tuple[float, float, float]) -> str:
        return f"{v[0]:,.0f} ({v[1]:,.0f}-{v[2]:,.0f})"

    return [
        f"Client: {sat['client']}, {sat['seconds']:g} s per run, alternating; {sat['backend']}.",
        "",
        "| proxy (CPU 1) | requests/s | CPU us/request |",
        "| --- | --- | --- |",
        f"| bare aiohttp pass-through | {cell(sat['aiohttp_rps'])} | "
        f"{cell(sat['aiohttp_cpu_us'])} |",
        f"| `uvicorn ballast_asgi.gateway:app` (defaults) | {cell(sat['uvicorn_rps'])} | "
        f"{cell(sat['uvicorn_cpu_us'])} |",
        "",
        f"Gateway / bare: CPU per request **{sat['cpu_ratio']:.2f}x** (target <= 1.5x), "
        f"rate **{sat['rate_ratio']:.2f}x** (target >= 0.67x).",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the saturation case alone and print its table."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench.saturation")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--conns", type=int, default=16)
    a = p.parse_args(argv)
    pin_self(CPU_LOAD)
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs:
        sat = saturation(procs, a.seconds, a.reps, a.conns)
    print("\n".join(table(sat)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
