"""A/B of gateway versions in the closed-loop saturation case (one run, alternating).

    python -m experiments.bench.ab --variant base=/tmp/base-tree --variant new=. \\
        [--variant new-alog=.:--access-log] [--variant new-noretry=.@noretry.yaml] \
        [--seconds 4] [--reps 5] [--shed]

Each ``--variant NAME=TREE[:UVICORN_ARGS][@CONFIG]`` is ``uvicorn
ballast_asgi.gateway:app`` imported from the checkout ``TREE`` (``--app-dir``
and ``PYTHONPATH``), with every default plus the space-separated extra
arguments and, with ``@CONFIG``, that YAML file as ``BALLAST_CONFIG`` (e.g.
``retry:\n  enabled: false`` to compare a stage on and off); the bare aiohttp
pass-through runs next to them. All pinned to CPU 1, nginx (1 KB) and wrk
(one thread, 16 connections) on CPU 0, configurations rotated each
repetition. Prints medians (ranges) of requests/s and CPU us per request and
each variant's ratio to the bare pass-through and to the first variant.
``--shed``: every request carries ``X-Deadline-Ms: 0`` (shed at admission) and
is sent by the raw closed loop of ``drive.blast`` (32 connections) instead of
wrk: CPU us per shed and sheds/s (the bare pass-through proxies them).
Every process started is stopped by PID.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from experiments._harness.cpu import pin_self
from experiments._harness.procs import Procs, processes
from experiments._harness.servers import (
    Target,
    ensure_package,
    start_backend,
    start_bare,
    start_on_free_ports,
)
from experiments._harness.stats import spread
from experiments.bench.drive import blast, request_bytes
from experiments.bench.saturation import CPU_LOAD, CPU_PROXY, one


def shed_run(t: Target, seconds: float, rep: int) -> dict[str, Any]:
    """One closed-loop run of dead-on-arrival requests (32 raw connections)."""
    b = blast(t, "shed", request_bytes("/1k", {"X-Deadline-Ms": "0"}), 32, seconds, rep)
    return {"config": t.name, "rps": b.rps, "cpu_us": b.cpu_us}


def parse_variant(spec: str) -> tuple[str, str, list[str], str | None]:
    """``NAME=TREE[:ARGS][@CONFIG]`` -> name, tree, uvicorn arguments, absolute config path."""
    name, _, rest = spec.partition("=")
    rest, at, config = rest.partition("@")
    tree, _, args = rest.partition(":")
    if not name or not tree or (at and not config):
        raise ValueError(f"--variant must be NAME=TREE[:ARGS][@CONFIG], got {spec!r}")
    if config and not Path(config).is_file():
        raise ValueError(f"--variant {name}: no config file {config!r}")
    return name, tree, args.split(), str(Path(config).resolve()) if config else None


def start_variant(
    procs: Procs, name: str, tree: str, extra: list[str], upstream: str, config: str | None = None
) -> Target:
    """``uvicorn ballast_asgi.gateway:app`` imported from ``tree``, pinned to the proxy CPU
    (``config``: the YAML file it reads as ``BALLAST_CONFIG``)."""
    uvicorn = os.path.join(os.path.dirname(sys.executable), "uvicorn")
    root = str(Path(tree).resolve())

    def cmd(port: int, _admin: int) -> list[str]:
        return [uvicorn, "ballast_asgi.gateway:app", "--host", "127.0.0.1", "--port", str(port),
                "--app-dir", root, *extra]  # fmt: skip

    env = {"BALLAST_UPSTREAM": upstream, "PYTHONPATH": root}
    if config is not None:
        env["BALLAST_CONFIG"] = config
    proc, port, _ = start_on_free_ports(procs, cmd, CPU_PROXY, name, env)
    return Target(name, port, proc.pid)


def main(argv: list[str] | None = None) -> int:
    """Run the variants and the bare pass-through alternately; print the table."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench.ab")
    p.add_argument("--variant", action="append", required=True, help="NAME=TREE[:ARGS][@CONFIG]")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--conns", type=int, default=16)
    p.add_argument("--shed", action="store_true", help="dead-on-arrival requests (sheds)")
    a = p.parse_args(argv)
    try:
        variants = [parse_variant(spec) for spec in a.variant]
    except ValueError as exc:
        p.error(str(exc))
    pin_self(CPU_LOAD)
    wrk = ensure_package("wrk", "wrk")
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs:
        backend, _ = start_backend(procs, CPU_LOAD)
        targets = [start_bare(procs, "aiohttp", backend.port, CPU_PROXY)]
        for name, tree, args, config in variants:
            targets.append(start_variant(procs, name, tree, args, backend.base, config))
        for t in targets:
            shed_run(t, 1.0, -1) if a.shed else one(t, wrk, a.conns, 1.0, -1)  # warm-up
        runs: list[dict[str, Any]] = []
        for rep in range(a.reps):
            k = rep % len(targets)
            for t in targets[k:] + targets[:k]:
                run = (
                    shed_run(t, a.seconds, rep) if a.shed else one(t, wrk, a.conns, a.seconds, rep)
                )
                runs.append(run)
                r = runs[-1]
                print(f"  {r['config']:14s} rep {rep}: {r['rps']:8.0f} rps, "
                      f"{r['cpu_us']:6.1f} us/req", flush=True)  # fmt: skip
    print_table(targets, runs)
    return 0


def print_table(targets: list[Target], runs: list[dict[str, Any]]) -> None:
    """Medians (ranges) per configuration and the ratios."""
    rows = {}
    for t in targets:
        rows[t.name] = (spread(r["rps"] for r in runs if r["config"] == t.name),
                        spread(r["cpu_us"] for r in runs if r["config"] == t.name))  # fmt: skip
    bare, first = rows[targets[0].name], rows[targets[min(1, len(targets) - 1)].name]
    print("| config | requests/s | CPU us/request | CPU / bare | rate / bare | CPU / first |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, (rps, cpu) in rows.items():
        print(f"| {name} | {rps[0]:,.0f} ({rps[1]:,.0f}-{rps[2]:,.0f}) | {cpu[0]:.1f} "
              f"({cpu[1]:.1f}-{cpu[2]:.1f}) | {cpu[0] / bare[1][0]:.2f} | "
              f"{rps[0] / bare[0][0]:.2f} | {cpu[0] / first[1][0]:.2f} |")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
