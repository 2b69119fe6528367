"""``python -m experiments.routeprobe``: issue 28's httpbin case, on loopback, bounded.

10 closed-loop clients on ``/delay/1`` (1 s) and 10 on ``/get`` (instant) for
``--seconds`` (15) through the default gateway, then the same through a
gateway with ``limiter.algorithm: fixed`` at 1000, in one invocation. Target:
``/get`` served through the default gateway >= 90 % of the fixed-1000
gateway's. Every process started here is stopped here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from experiments._harness.procs import free_port

FIXED_1000 = "limiter:\n  algorithm: fixed\n  fixed_limit: 1000\nmax_concurrent_requests: 1000\n"


def _start(args: list[str], env: dict[str, str], health: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.monotonic() + 20
    while time.monotonic() < end:
        try:
            if httpx.get(health, timeout=1).status_code < 500:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)  # readiness poll, bounded
    proc.kill()
    raise SystemExit(f"did not start: {args}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _load(base: str, seconds: float, clients: int) -> dict[str, list[float]]:
    lat: dict[str, list[float]] = {"/get": [], "/delay/1": []}
    end = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=4 * clients)

    async def one(client: httpx.AsyncClient, path: str) -> None:
        while time.monotonic() < end:
            t0 = time.monotonic()
            r = await client.get(path)
            if r.status_code == 200:
                lat[path].append(time.monotonic() - t0)

    async with httpx.AsyncClient(base_url=base, timeout=10, limits=limits) as client:
        await asyncio.gather(
            *(one(client, p) for p in ("/get", "/delay/1") for _ in range(clients))
        )
    return lat


def _p99(values: list[float]) -> float:
    ordered = sorted(values) or [0.0]
    return ordered[int(0.99 * (len(ordered) - 1))]


def main(argv: Sequence[str] | None = None) -> int:
    """Run both gateways and print the comparison with its verdict."""
    p = argparse.ArgumentParser(prog="python -m experiments.routeprobe", description=__doc__)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--upstream", default=None,
                   help="an upstream already running (e.g. httpbin: http://127.0.0.1:PORT); "
                        "default: the in-repo two-speed app on a free port")  # fmt: skip
    a = p.parse_args(argv)
    env = {**os.environ}
    py = sys.executable
    if a.upstream:
        base_up, upstream = a.upstream.rstrip("/"), None
    else:
        up = free_port()
        base_up = f"http://127.0.0.1:{up}"
        upstream = _start([py, "-m", "uvicorn", "experiments.routeprobe.app:app", "--port",
                           str(up), "--log-level", "warning"], env, f"{base_up}/get")  # fmt: skip
    served: dict[str, dict[str, list[float]]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, extra in (("default", ""), ("fixed-1000", FIXED_1000)):
                cfg = Path(tmp) / f"{name}.yaml"
                cfg.write_text(f"upstream: {base_up}\n{extra}")
                port = free_port()
                genv = {**env, "BALLAST_CONFIG": str(cfg)}
                gw = _start([py, "-m", "uvicorn", "ballast_asgi.gateway:app", "--port", str(port),
                             "--log-level", "warning"], genv,
                            f"http://127.0.0.1:{port}/_ballast/health")  # fmt: skip
                try:
                    served[name] = asyncio.run(
                        _load(f"http://127.0.0.1:{port}", a.seconds, a.clients)
                    )
                finally:
                    _stop(gw)
    finally:
        if upstream is not None:
            _stop(upstream)
    for name, lat in served.items():
        print(f"{name:<11} /get served {len(lat['/get']):6d} p99 {_p99(lat['/get']) * 1e3:7.1f} ms"
              f"   /delay/1 served {len(lat['/delay/1']):4d} p99 "
              f"{_p99(lat['/delay/1']) * 1e3:7.1f} ms")  # fmt: skip
    ratio = len(served["default"]["/get"]) / max(1, len(served["fixed-1000"]["/get"]))
    verdict = "met" if ratio >= 0.9 else "missed"
    print(f"/get through the default gateway / fixed-1000: {ratio:.3f} (target >= 0.90): {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
