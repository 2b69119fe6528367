"""``make bench``: the gateway's cost per request against nginx, HAProxy and bare Python proxies.

    python -m experiments.bench              # full run (about 10 minutes)
    python -m experiments.bench --quick      # smoke version (about 2 minutes)
    python -m experiments.bench --reps 3 --rates 500,1000,2000,3000 --seconds 3

One run, on loopback, with the proxy under test pinned to CPU 1 and the
generator (this process) plus the backend pinned to CPU 0:

1. **Grid.** Every configuration (direct to the nginx 1 KB backend; nginx and
   HAProxy as reverse proxies; bare uvicorn pass-throughs over plain httpx and
   over aiohttp; the ballast gateway with all four stages, fixed limit 1000
   and default gradient) at each open-loop rate, configurations alternating
   innermost and rotated each repetition, ``--reps`` times. Per run: p50/p99
   from intended send time, failures, throughput, proxy CPU us per request.
2. **Ramp.** Above the grid, one run per rate in ``--ramp`` until a config
   stops holding (p99 < 50 ms, failures < 0.1 %, throughput >= 95 %).
3. **Sheds.** A closed-loop raw client against the fixed-limit gateway, with
   ``X-Deadline-Ms: 0`` (every request dead on arrival) and without (proxied),
   alternating: sheds/s on one core and CPU us per shed vs per proxied request.
4. **Saturation** (``experiments.bench.saturation``): closed loop (wrk, 16
   connections) against the bare aiohttp pass-through and the gateway started
   as ``uvicorn ballast_asgi.gateway:app``, alternating: CPU and rate ratios.
5. **Capacity cap** (``experiments.bench.capacity``): RSS and critical p99 at
   3x and 12x the simulator's knee, default cap vs effectively none.
6. **Headroom** (``experiments.bench.headroom``, issue 31; alone: ``make
   bench-headroom``): nginx proxy and ``return 429``, uvicorn's constant-429
   floor, bare aiohttp, the gateway proxied and shedding, wrk, alternating;
   written to the marked block of ``docs/bench.md``.

Raw results go to ``runs/bench-<time>/results.json`` (gitignored); the report
to ``docs/bench.md`` and ``docs/img/bench.png`` (full runs) or next to the raw
data (``--quick``). Every process started is stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments._harness.cpu import pin_self, status_kb
from experiments._harness.machine import machine, versions
from experiments._harness.procs import Procs, processes, stop_on_signals
from experiments._harness.servers import (
    Target,
    ensure_package,
    find_binary,
    start_backend,
    start_bare,
    start_gateway,
    start_haproxy,
    start_nginx_proxy,
)
from experiments.bench.capacity import capacity_bench
from experiments.bench.drive import BlastRun, OpenRun, blast, open_loop, request_bytes
from experiments.bench.headroom import headroom, update_docs
from experiments.bench.report import write_report
from experiments.bench.saturation import saturation

CPU_LOAD, CPU_PROXY = 0, 1
FIXED_CONFIG = "limiter:\n  algorithm: fixed\n  fixed_limit: 1000\n"
GRADIENT_CONFIG = "limiter:\n  algorithm: gradient\n"


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options; ``--quick`` shortens every phase."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="short smoke run (about 2 minutes)")
    p.add_argument("--reps", type=int, help="repetitions per grid point (3; quick 1)")
    p.add_argument("--rates", type=_floats, help="open-loop rates (500,1000,2000,3000)")
    p.add_argument("--seconds", type=float, help="seconds per grid run (3; quick 2)")
    p.add_argument("--ramp", type=_floats, help="ramp rates above the grid (4000,5000,6000)")
    p.add_argument("--shed-seconds", type=float, help="seconds per shed run (3; quick 2)")
    p.add_argument("--conns", type=int, default=32, help="closed-loop connections (32)")
    p.add_argument("--cap-3x", type=float, help="seconds at 3x the knee (10; quick 5)")
    p.add_argument("--cap-12x", type=float, help="seconds at 12x the knee (60; quick 10)")
    p.add_argument("--no-capacity", action="store_true", help="skip the capacity-cap phase")
    p.add_argument("--no-headroom", action="store_true", help="skip the headroom table")
    p.add_argument("--docs", action="store_true", help="write docs/ even with --quick")
    p.add_argument("--out", type=Path, help="raw results directory (runs/bench-<time>)")
    a = p.parse_args(argv)
    q = a.quick
    a.reps = a.reps or (1 if q else 3)
    a.rates = a.rates or ([500.0, 2000.0] if q else [500.0, 1000.0, 2000.0, 3000.0])
    a.seconds = a.seconds or (2.0 if q else 3.0)
    a.ramp = a.ramp if a.ramp is not None else ([4000.0] if q else [4000.0, 5000.0, 6000.0])
    a.shed_seconds = a.shed_seconds or (2.0 if q else 3.0)
    a.cap_3x = a.cap_3x or (5.0 if q else 10.0)
    a.cap_12x = a.cap_12x or (10.0 if q else 60.0)
    a.out = a.out or Path("runs") / time.strftime("bench-%Y%m%d-%H%M%S")
    return a


def start_targets(procs: Procs, notes: list[str]) -> list[Target]:
    """The backend ('direct') and every proxy configuration that can run here."""
    direct, note = start_backend(procs, CPU_LOAD)
    notes.append(note)
    up = direct.port
    targets = [direct]
    if find_binary("nginx"):
        targets.append(start_nginx_proxy(procs, up, CPU_PROXY))
    else:
        notes.append("nginx (as proxy) skipped: not installed and apt-get failed")
    haproxy = ensure_package("haproxy", "haproxy")
    if haproxy:
        targets.append(start_haproxy(procs, haproxy, up, CPU_PROXY))
    else:
        notes.append("HAProxy skipped: not installed and apt-get failed")
    targets += [
        start_bare(procs, "httpx", up, CPU_PROXY),
        start_bare(procs, "aiohttp", up, CPU_PROXY),
    ]
    targets.append(start_gateway(procs, "ballast-fixed", direct.base, CPU_PROXY, FIXED_CONFIG))
    targets.append(
        start_gateway(procs, "ballast-gradient", direct.base, CPU_PROXY, GRADIENT_CONFIG)
    )
    return targets


def _show(r: OpenRun) -> None:
    print(
        f"  {r.config:17s} {r.rate:6.0f} rps rep {r.rep}: p50 {r.p50_ms:8.2f} p99 {r.p99_ms:8.2f}"
        f" ms, failed {r.failed:5d}/{r.scheduled}, {r.cpu_us:7.0f} us/req, "
        f"gen lag p99 {r.gen_lag_p99_ms:.2f} ms{'' if r.held else '  (not held)'}",
        flush=True,
    )


def grid(targets: list[Target], a: argparse.Namespace) -> list[OpenRun]:
    """All configs x rates x reps, configs alternating innermost, order rotated per rep."""
    for t in targets:  # warm-up: connections, imports, first-request paths
        open_loop(t, 300.0, 1.0, rep=-1)
    runs = []
    for rep in range(a.reps):
        order = targets[rep % len(targets) :] + targets[: rep % len(targets)]
        for rate in a.rates:
            for t in order:
                runs.append(open_loop(t, rate, a.seconds, rep))
                _show(runs[-1])
    return runs


def ramp(targets: list[Target], runs: list[OpenRun], a: argparse.Namespace) -> list[OpenRun]:
    """One run per ramp rate for each config that held the whole grid, until it fails."""
    out = []
    for t in targets:
        if not all(held_median(runs, t.name, r) for r in a.rates):
            continue
        for rate in a.ramp:
            out.append(open_loop(t, rate, a.seconds, rep=0))
            _show(out[-1])
            if not out[-1].held:
                break
    return out


def held_median(runs: list[OpenRun], config: str, rate: float) -> bool:
    """A grid point is held when the majority of its repetitions held."""
    votes = [r.held for r in runs if r.config == config and r.rate == rate]
    return bool(votes) and sum(votes) * 2 > len(votes)


def sheds(gw: Target, a: argparse.Namespace) -> list[BlastRun]:
    """Closed loop against the gateway: proxied vs dead-on-arrival, alternating."""
    proxied = request_bytes("/1k", {"X-Priority": "standard"})
    doomed = request_bytes("/1k", {"X-Priority": "standard", "X-Deadline-Ms": "0"})
    blast(gw, "warm", doomed, a.conns, 1.0, rep=-1)
    out = []
    for rep in range(a.reps):
        for mode, req in (("proxied", proxied), ("shed", doomed)):
            out.append(blast(gw, mode, req, a.conns, a.shed_seconds, rep))
            b = out[-1]
            print(
                f"  closed loop {mode:8s} rep {rep}: {b.rps:8.0f} rps, {b.cpu_us:6.1f} us/req, "
                f"gateway CPU {100 * b.cpu_util:.0f} %, 2xx {b.status_2xx}",
                flush=True,
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run every phase, save the raw data, write the report."""
    a = parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2 and (os.cpu_count() or 1) < 2:
        print("bench: needs 2 CPUs (proxy on CPU 1, generator on CPU 0)", file=sys.stderr)
        return 2
    pin_self(CPU_LOAD)
    stop_on_signals()
    a.out.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {
        "machine": {**machine(), "versions": versions()},
        "args": {k: str(v) for k, v in vars(a).items()},
    }
    notes: list[str] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="ballast-bench-") as tmp, processes(Path(tmp)) as procs:
        targets = start_targets(procs, notes)
        print("bench: grid", flush=True)
        runs = grid(targets, a)
        print("bench: ramp", flush=True)
        ramps = ramp(targets, runs, a)
        print("bench: sheds", flush=True)
        gw = next(t for t in targets if t.name == "ballast-fixed")
        blasts = sheds(gw, a)
        rss = {t.name: status_kb(t.pid, "VmHWM") / 1024 for t in targets if t.pid}
        procs.stop_all()
        print("bench: saturation (closed loop)", flush=True)
        sat = saturation(procs, a.shed_seconds, a.reps, 16)
        procs.stop_all()
        caps: list[dict[str, Any]] = []
        if not a.no_capacity:
            print("bench: capacity cap", flush=True)
            caps = capacity_bench(procs, CPU_PROXY, CPU_LOAD, a.cap_3x, a.cap_12x)
            procs.stop_all()
        room: dict[str, Any] = {}
        if not a.no_headroom:
            print("bench: headroom (issue 31)", flush=True)
            room = headroom(procs, a.shed_seconds + 2.0, a.reps, 16)
    doc.update(
        notes=notes,
        grid=[r.to_dict() for r in runs],
        ramp=[r.to_dict() for r in ramps],
        sheds=[b.to_dict() for b in blasts],
        vmhwm_mb=rss,
        capacity=caps,
        saturation=sat,
        headroom=room,
        elapsed_s=round(time.monotonic() - t0, 1),
        loadavg_end=[round(x, 2) for x in os.getloadavg()],
    )
    (a.out / "results.json").write_text(json.dumps(doc, indent=1))
    docs = not a.quick or a.docs
    md = write_report(doc, a.out, docs_dir=Path("docs") if docs else None)
    if docs and "summary" in room:
        update_docs(room, Path("docs") / "bench.md")
    print(f"\nbench: {doc['elapsed_s']} s; raw data {a.out}/results.json; report {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
