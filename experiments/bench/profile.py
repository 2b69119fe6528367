"""Profile the gateway's hot path under the bench's load (py-spy, raw folded stacks).

    python -m experiments.bench.profile --rate 2000 --seconds 8 [--shed]
    python -m experiments.bench.profile --saturation --seconds 8

Starts the nginx 1 KB backend (CPU 0) and the gateway (CPU 1), drives it from
CPU 0 and records the gateway with ``py-spy record --format raw`` at 500 Hz.
Prints the functions with the most own samples and their inclusive share,
the own samples per component (uvicorn, aiohttp, httpx, our stages, ...) and
the CPU us per request of the same run.

* default: the ballast CLI with all four stages (fixed limit 1000), open loop
  at ``--rate`` from this process;
* ``--shed``: the same gateway, ``X-Deadline-Ms: 0`` (every request shed at
  admission), through the closed-loop raw client;
* ``--saturation``: the closed-loop case of ``make bench``: the gateway started
  as ``uvicorn ballast_asgi.gateway:app`` with every default, driven by wrk
  (one thread, 16 connections) when installed, else the raw closed loop.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from experiments._harness.procs import processes
from experiments._harness.servers import (
    ensure_package,
    start_gateway,
    start_nginx_backend,
    start_uvicorn_gateway,
)
from experiments.bench.drive import blast, open_loop, request_bytes
from experiments.bench.run import CPU_LOAD, CPU_PROXY, FIXED_CONFIG
from experiments.bench.saturation import one
from experiments.hotpath.micro import print_profile

#: Own samples are attributed to the first component whose marker is in the leaf's file.
COMPONENTS = (
    ("uvicorn (server, httptools)", ("uvicorn/", "httptools")),
    ("aiohttp client", ("aiohttp/", "multidict/", "yarl/", "aiohappyeyeballs/", "propcache/")),
    ("httpx objects", ("httpx/", "httpcore/")),
    ("prometheus_client", ("prometheus_client/",)),
    ("logging", ("logging/",)),
    ("ballast stages (middleware/)", ("ballast_asgi/middleware/",)),
    ("ballast proxy (proxy/)", ("ballast_asgi/proxy/",)),
    ("ballast cores (core/)", ("ballast_asgi/core/",)),
    ("ballast other", ("ballast_asgi/",)),
    ("asyncio / event loop", ("asyncio/", "uvloop", "<frozen", "contextvars")),
)


def components(path: Path) -> list[tuple[str, float]]:
    """Share of own samples per component (leaf frame's file), largest first."""
    own: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        leaf = stack.rsplit(";", 1)[-1]
        name = next((c for c, marks in COMPONENTS if any(m in leaf for m in marks)), "other")
        own[name] = own.get(name, 0) + n
    return sorted(((c, 100.0 * n / max(total, 1)) for c, n in own.items()), key=lambda x: -x[1])


def main(argv: list[str] | None = None) -> int:
    """Run the profile and print its top."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench.profile")
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--shed", action="store_true", help="profile the dead-on-arrival shed path")
    p.add_argument("--saturation", action="store_true", help="uvicorn-started gateway, wrk")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--raw", type=Path, help="also keep py-spy's raw folded stacks here")
    a = p.parse_args(argv)
    os.sched_setaffinity(0, {CPU_LOAD})
    py_spy = str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs:
        up = start_nginx_backend(procs, CPU_LOAD)
        if a.saturation:
            gw = start_uvicorn_gateway(procs, "gw", up.base, CPU_PROXY)
            wrk = ensure_package("wrk", "wrk")
            one(gw, wrk, 16, 1.0, -1)
        else:
            gw = start_gateway(procs, "gw", up.base, CPU_PROXY, FIXED_CONFIG)
            open_loop(gw, 500.0, 1.0, rep=-1)
        out = Path(tmp) / "profile.txt"
        cmd = [py_spy, "record", "-p", str(gw.pid), "-d", str(int(a.seconds)), "-f", "raw",
               "-o", str(out), "-r", "500", "--nonblocking"]  # fmt: skip
        spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if a.saturation:
                sat = one(gw, wrk, 16, a.seconds, 0)
                print(f"saturation: {sat['rps']:,.0f} rps, {sat['cpu_us']:.1f} us/req")
            elif a.shed:
                req = request_bytes("/1k", {"X-Deadline-Ms": "0"})
                b = blast(gw, "shed", req, 32, a.seconds, rep=0)
                print(f"shed closed loop: {b.rps:,.0f} rps, {b.cpu_us:.1f} us/req")
            else:
                r = open_loop(gw, a.rate, a.seconds, rep=0)
                print(f"open loop {a.rate:.0f} rps: p99 {r.p99_ms:.1f} ms, {r.cpu_us:.0f} us/req")
        finally:
            spy.wait(60)
        if a.raw is not None:
            a.raw.write_text(out.read_text())
        print_profile(out, a.top)
        print("\n| component | own % |\n| --- | --- |")
        for name, share in components(out):
            print(f"| {name} | {share:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
