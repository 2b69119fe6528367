"""Micro-benchmark of the bare proxy (ProxyApp on uvicorn) per transport.

Starts a 1 KB upstream (nginx when installed, else a raw-ASGI uvicorn app),
one uvicorn process per configuration serving ``ProxyApp`` (pinned to the last
CPU), and drives each with a closed-loop aiohttp client (pinned to CPU 0) for
``--seconds``, alternating configurations, ``--reps`` times. Prints the
median requests/s and the proxy process's CPU microseconds per request
(utime + stime from /proc/<pid>/stat).

    python -m experiments.hotpath.micro --seconds 5 --reps 3 --conns 32
    python -m experiments.hotpath.micro --profile aiohttp   # py-spy top of the hot path

Every process it starts is stopped by PID on exit. Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments._harness.cpu import cpu_s
from experiments._harness.procs import Procs, free_port, processes
from experiments._harness.servers import Target, start_backend

CONFIGS = ("direct", "aiohttp", "httpx")


def start_proxy(procs: Procs, config: str, upstream: str, cpu: int) -> Target:
    """A uvicorn process serving ProxyApp with one transport, pinned to ``cpu``."""
    port = free_port()
    cmd = [sys.executable, "-m", "experiments.hotpath.micro", "serve", "--transport", config,
           "--upstream", upstream, "--port", str(port)]  # fmt: skip
    proc = procs.start(cmd, cpu, port, f"proxy-{config}")
    return Target(config, port, proc.pid)


async def drive(port: int, seconds: float, conns: int) -> tuple[int, int]:
    """Closed loop: ``conns`` workers each sending GETs back to back. Returns (ok, errors)."""
    import aiohttp

    ok = errors = 0
    end = time.monotonic() + seconds
    url = f"http://127.0.0.1:{port}/1k?a=1"
    connector = aiohttp.TCPConnector(limit=conns)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            nonlocal ok, errors
            while time.monotonic() < end:
                try:
                    async with session.get(url) as resp:
                        await resp.read()
                        ok += resp.status == 200
                        errors += resp.status != 200
                except (aiohttp.ClientError, TimeoutError):
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(conns)))
    return ok, errors


def measure(pid: int | None, port: int, seconds: float, conns: int) -> tuple[float, float, int]:
    """One run: (rps, CPU us/request of ``pid``, errors)."""
    asyncio.run(drive(port, min(1.0, seconds), conns))  # warm-up
    before = cpu_s(pid) if pid else 0.0
    t0 = time.monotonic()
    ok, errors = asyncio.run(drive(port, seconds, conns))
    elapsed = time.monotonic() - t0
    used = (cpu_s(pid) - before) if pid else 0.0
    return ok / elapsed, (used / ok * 1e6) if ok and pid else float("nan"), errors


def bench(args: argparse.Namespace) -> None:
    """Run every configuration alternately and print the medians."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    cpus = sorted(os.sched_getaffinity(0))
    proxy_cpu, load_cpu = cpus[-1], cpus[0]
    os.sched_setaffinity(0, {load_cpu})
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs:
        up, up_name = start_backend(procs, load_cpu)
        targets: dict[str, tuple[int | None, int]] = {"direct": (None, up.port)}
        for name in args.configs:
            if name != "direct":
                proxy = start_proxy(procs, name, up.base, proxy_cpu)
                targets[name] = (proxy.pid, proxy.port)
        if args.profile:
            profile(targets[args.profile], args)
            return
        results: Runs = {n: [] for n in args.configs}
        for rep in range(args.reps):
            for name in args.configs:
                pid, port = targets[name]
                results[name].append(measure(pid, port, args.seconds, args.conns))
                rps, us, err = results[name][-1]
                print(f"rep {rep + 1} {name:8s} {rps:9.0f} rps {us:8.0f} us/req {err} errors")
        report(results, up_name, args)


Runs = dict[str, list[tuple[float, float, int]]]


def report(results: Runs, up: str, args: argparse.Namespace) -> None:
    """The median table in Markdown."""
    print(f"\nupstream: {up}; {args.conns} conns closed loop; {args.seconds:.0f} s x {args.reps}")
    print("| config | rps (median) | proxy CPU us/request (median) | errors |")
    print("| --- | --- | --- | --- |")
    for name, runs in results.items():
        rps = statistics.median(r[0] for r in runs)
        us = statistics.median(r[1] for r in runs)
        print(f"| {name} | {rps:,.0f} | {us:,.0f} | {sum(r[2] for r in runs)} |")


def profile(target: tuple[int | None, int], args: argparse.Namespace) -> None:
    """Attach py-spy to the proxy while it is driven; print the top frames."""
    pid, port = target
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out = Path(tempfile.mkdtemp()) / "profile.txt"
    cmd = [py_spy, "record", "-p", str(pid), "-d", str(int(args.seconds)), "-f", "raw",
           "-o", str(out), "-r", "250", "--nonblocking"]  # fmt: skip
    spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    asyncio.run(drive(port, args.seconds + 1.0, args.conns))
    spy.wait(30)
    print_profile(out)


def print_profile(path: Path, top: int = 20) -> None:
    """Self and inclusive sample shares per function from py-spy's raw (folded) output."""
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
                  for f in stack.split(";")]  # fmt: skip
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for f in set(frames):
            incl[f] = incl.get(f, 0) + n
    print(f"{total} samples\n| own % | inclusive % | function |\n| --- | --- | --- |")
    for f, n in sorted(own.items(), key=lambda kv: -kv[1])[:top]:
        print(f"| {100 * n / total:.1f} | {100 * incl[f] / total:.1f} | `{f}` |")


def serve(args: argparse.Namespace) -> None:
    """Child: uvicorn (uvloop, httptools) serving ProxyApp with one transport."""
    import uvicorn

    from ballast_asgi.config import ProxyConfig
    from ballast_asgi.proxy.app import ProxyApp

    app = ProxyApp(args.upstream, config=ProxyConfig(transport=args.transport))
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools",
                            lifespan="on", access_log=False, log_level="warning")  # fmt: skip
    uvicorn.Server(config).run()


def main(argv: list[str] | None = None) -> None:
    """Entry point: ``bench`` (default), or the ``serve`` / ``upstream`` children."""
    p = argparse.ArgumentParser(prog="python -m experiments.hotpath.micro")
    sub = p.add_subparsers(dest="cmd")
    s = sub.add_parser("serve")
    s.add_argument("--transport", choices=("aiohttp", "httpx"), required=True)
    s.add_argument("--upstream", required=True)
    s.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--conns", type=int, default=32)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS)
    p.add_argument("--profile", choices=("aiohttp", "httpx"), default=None)
    args = p.parse_args(argv)
    serve(args) if args.cmd == "serve" else bench(args)


if __name__ == "__main__":
    main()
