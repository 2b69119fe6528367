"""Where a request's microseconds go, without py-spy: the gateway under cProfile, wrk against it.

    python -m experiments.bench.cprof [--seconds 8] [--shed] [--top 25]

Starts the nginx 1 KB backend (CPU 0) and the gateway as ``uvicorn.run(
"ballast_asgi.gateway:app")`` with every default (CPU 1) in a child that
profiles itself between SIGUSR1 and SIGUSR2 (start-up and the warm-up left
out), loads it with ``wrk -t1 -c16`` (CPU 0; ``--shed``: every request carries
``X-Deadline-Ms: 0``) and prints the functions with
the most own time and the own time per component (the file of the function:
server, event loop, stages, cores, proxy client, metrics), as microseconds per
response and as shares. cProfile's own overhead inflates every Python call
(roughly 2x here) and it measures wall time (a loaded machine inflates it more):
read the shares and the ranking, not the absolute numbers; the CPU per response
without the profiler is the headroom table's.
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import sys
import tempfile
import time
from pathlib import Path

from experiments._harness.procs import HOST, processes
from experiments._harness.servers import (
    Target,
    ensure_package,
    start_nginx_backend,
    start_on_free_ports,
)
from experiments.bench.headroom import CPU_LOAD, CPU_PROXY, wrk_run

#: Own time is attributed to the first component whose marker is in the function's file.
COMPONENTS = (
    ("server: uvicorn protocol + httptools", ("uvicorn/", "httptools")),
    ("server: ballast protocol (server/)", ("ballast_asgi/server/",)),
    ("upstream client (proxy/transports/)", ("ballast_asgi/proxy/transports/",)),
    ("proxy app (proxy/)", ("ballast_asgi/proxy/",)),
    ("client transport (client/)", ("ballast_asgi/client/",)),
    ("stages (middleware/)", ("ballast_asgi/middleware/",)),
    ("cores (core/)", ("ballast_asgi/core/",)),
    ("metrics (prometheus_client, telemetry/)", ("prometheus_client/", "ballast_asgi/telemetry/")),
    ("gateway, routing, other ballast", ("ballast_asgi/",)),
    ("aiohttp / multidict / yarl", ("aiohttp/", "multidict/", "yarl/")),
    ("event loop (asyncio, uvloop, builtins)", ("asyncio/", "uvloop", "~", "<built-in", "{")),
)


def component(filename: str) -> str:
    """The component of one profiled function's file."""
    return next((c for c, marks in COMPONENTS if any(m in filename for m in marks)), "other")


def report(stats: pstats.Stats, responses: int, top: int) -> list[str]:
    """Markdown: the top functions by own time and the own time per component."""
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values()) or 1.0
    per = 1e6 / max(responses, 1)
    rows = sorted(raw.items(), key=lambda kv: -kv[1][2])[:top]
    calls = sum(v[1] for v in raw.values()) / max(responses, 1)
    out = [f"{responses:,} responses; own time {total:.2f} s under the profiler; "
           f"{calls:.0f} function calls per response (Python and C)", "",
           "| own us/resp | own % | calls/resp | function |",
           "| --- | --- | --- | --- |"]  # fmt: skip
    for (file, line, name), v in rows:
        where = f"{file.rsplit('site-packages/', 1)[-1].rsplit('/work/', 1)[-1]}:{line}"
        n = v[1] / max(responses, 1)
        share = 100 * v[2] / total
        out.append(f"| {v[2] * per:.2f} | {share:.1f} | {n:.2f} | `{name}` ({where}) |")
    groups: dict[str, float] = {}
    for (file, _, _), v in raw.items():
        groups[component(file)] = groups.get(component(file), 0.0) + v[2]
    out += ["", "| component | own us/resp | own % |", "| --- | --- | --- |"]
    for name, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        out.append(f"| {name} | {t * per:.2f} | {100 * t / total:.1f} |")
    return out


def serve(port: int, out: Path) -> None:
    """Child: the gateway on uvicorn, profiled between SIGUSR1 and SIGUSR2 (stats to ``out``)."""
    import cProfile

    import uvicorn

    prof = cProfile.Profile()

    def start(*_: object) -> None:
        prof.enable()

    def stop(*_: object) -> None:
        prof.disable()
        prof.dump_stats(str(out))

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    uvicorn.run("ballast_asgi.gateway:app", host=HOST, port=port)


def main(argv: list[str] | None = None) -> int:
    """Profile the gateway under wrk and print where the time went."""
    if argv is None and sys.argv[1:2] == ["serve"]:
        s = argparse.ArgumentParser()
        s.add_argument("--port", type=int, required=True)
        s.add_argument("--out", type=Path, required=True)
        args = s.parse_args(sys.argv[2:])
        serve(args.port, args.out)
        return 0
    p = argparse.ArgumentParser(prog="python -m experiments.bench.cprof", description=__doc__)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--shed", action="store_true", help="every request dead on arrival")
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args(argv)
    os.sched_setaffinity(0, {CPU_LOAD})
    wrk = ensure_package("wrk", "wrk")
    if wrk is None:
        print("cprof: wrk not installed (make system-deps)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs:
        up = start_nginx_backend(procs, CPU_LOAD)
        out = Path(tmp) / "gateway.prof"

        def cmd(port: int, _admin: int) -> list[str]:
            return [sys.executable, "-m", "experiments.bench.cprof", "serve", "--port", str(port),
                    "--out", str(out)]  # fmt: skip

        proc, port, _ = start_on_free_ports(
            procs, cmd, CPU_PROXY, "gw", {"BALLAST_UPSTREAM": up.base}
        )
        gw = Target("gw", port, proc.pid)
        wrk_run(wrk, gw, 16, 2.0, a.shed)  # warm-up, not profiled
        proc.send_signal(signal.SIGUSR1)
        run = wrk_run(wrk, gw, 16, a.seconds, a.shed)
        proc.send_signal(signal.SIGUSR2)
        for _ in range(100):  # the child dumps its stats on SIGUSR2
            if out.exists() and out.stat().st_size:
                break
            time.sleep(0.1)
        responses = run["responses"]
        print(f"{'shed' if a.shed else 'proxied'}: {run['rps']:,.0f} rps under the profiler")
        print("\n".join(report(pstats.Stats(str(out)), responses, a.top)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
