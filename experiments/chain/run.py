"""Run the chain experiment: client -> gateway -> A -> B, three configurations.

Per configuration, fresh processes for each of two runs:

1. **trigger**: open-loop load at ``0.8 x`` B's normal capacity for
   ``3 * phase_s`` seconds; B's workers halve during the middle phase;
2. **overload**: ``3 x`` B's normal capacity for ``phase_s`` seconds.

The client sends ``X-Deadline-Ms: slo`` (ballast configurations: one
attempt; naive: three attempts of ``slo`` each, tenacity-style) and the
measurement-only ``X-Chain-Give-Up``. Writes the raw numbers to
``experiments/chain/out/last_run.json`` and the report to ``docs/chain.md``.

    python -m experiments.chain [--phase-s 10] [--modes naive,server,both]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from experiments._harness.cpu import cpu_s
from experiments._harness.machine import machine
from experiments._harness.procs import HOST, Procs, processes
from experiments._harness.servers import start_on_free_ports
from experiments.chain.naive import naive_wait_s
from experiments.chain.service_a import MODES

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "experiments" / "chain" / "out"
#: B: 2 workers, 40 ms / 200 ms (5 % slow): mean 48 ms, about 41.7 requests/s.
B_WORKERS, B_FAST_MS, B_SLOW_MS = 2, 40.0, 200.0
B_CAPACITY_RPS = B_WORKERS / (0.95 * B_FAST_MS + 0.05 * B_SLOW_MS) * 1000.0
SLO_S = 1.0
CRITICAL_SHARE = 0.2


@dataclass(frozen=True)
class Chain:
    """The three processes of one configuration."""

    url: str
    pids: dict[str, int]
    b_base: str
    a_base: str


def start_chain(procs: Procs, mode: str) -> Chain:
    """B, A in ``mode`` and the gateway (ballast, or the naive proxy) in front of A."""
    py = sys.executable
    b_cmd = [py, "-m", "experiments.chain.service_b", "--workers", str(B_WORKERS),
             "--fast-ms", str(B_FAST_MS), "--slow-ms", str(B_SLOW_MS), "--port"]  # fmt: skip
    b, b_port, _ = start_on_free_ports(procs, lambda p, _a: [*b_cmd, str(p)], None, f"{mode}-b")
    b_base = f"http://{HOST}:{b_port}"
    a_cmd = [py, "-m", "experiments.chain.service_a", "--b", b_base, "--mode", mode, "--port"]
    a, a_port, _ = start_on_free_ports(procs, lambda p, _a: [*a_cmd, str(p)], None, f"{mode}-a")
    a_base = f"http://{HOST}:{a_port}"
    if mode == "naive":
        g_cmd = [py, "-m", "experiments.chain.naive_gateway", "--upstream", a_base, "--port"]
        gw, g_port, _ = start_on_free_ports(procs, lambda p, _a: [*g_cmd, str(p)], None, "gw")
    else:

        def g_cmd2(port: int, admin: int) -> list[str]:
            return [py, "-m", "ballast_asgi", "--upstream", a_base, "--host", HOST,
                    "--port", str(port), "--admin-port", str(admin)]  # fmt: skip

        gw, g_port, _ = start_on_free_ports(procs, g_cmd2, None, f"{mode}-gw")
    pids = {"gateway": gw.pid, "a": a.pid, "b": b.pid}
    return Chain(f"http://{HOST}:{g_port}/work", pids, b_base, a_base)


async def _one(
    session: aiohttp.ClientSession, url: str, mode: str, priority: str, sent_at: float, ident: int
) -> tuple[int, float, str]:
    """One client request (naive: up to three attempts): final status, end time, shed reason."""
    attempts = 3 if mode == "naive" else 1
    rng = random.Random(int(sent_at * 1e6))
    status, reason = 0, ""
    for attempt in range(1, attempts + 1):
        give_up = time.time() + SLO_S
        headers = {"X-Priority": priority, "X-Chain-Give-Up": f"{give_up:.6f}",
                   "X-Chain-Id": str(ident)}  # fmt: skip
        if mode != "naive":
            headers["X-Deadline-Ms"] = str(int(SLO_S * 1000))
        try:
            timeout = aiohttp.ClientTimeout(total=SLO_S if mode == "naive" else SLO_S + 0.5)
            async with session.get(url, headers=headers, timeout=timeout) as response:
                await response.read()
                status = response.status
                reason = response.headers.get("X-Ballast-Reason", "")
        except (TimeoutError, aiohttp.ClientError):
            status, reason = 0, "no answer"
        if 0 < status < 500 or attempt == attempts:
            break
        await asyncio.sleep(naive_wait_s(attempt, rng))
    return status, time.time(), reason


Offered = tuple[float, list[list[Any]], list[Any]]


async def offer(
    url: str, mode: str, rate: float, duration_s: float, events: list[tuple[float, str]]
) -> Offered:
    """Open-loop load at ``rate`` for ``duration_s``: start time, records, A's snapshots.

    ``events`` (t, URL): a POST at ``t`` (the trigger), or a GET of A's snapshot.
    """
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    records: list[list[Any]] = []
    snapshots: list[list[Any]] = []
    rng = random.Random(7)
    async with aiohttp.ClientSession(connector=connector) as session:
        t0 = time.time()
        tasks = []

        async def send(i: int) -> None:
            sent = t0 + i / rate
            priority = "critical" if rng.random() < CRITICAL_SHARE else "standard"
            status, ended, reason = await _one(session, url, mode, priority, sent, i)
            records.append([sent - t0, ended - sent, status, i, reason])

        async def trigger(at: float, target: str) -> None:
            await asyncio.sleep(max(0.0, t0 + at - time.time()))
            if target.endswith("/_ballast/snapshot"):
                async with session.get(target) as response:
                    snapshots.append([at, json.loads(await response.read())])
                return
            async with session.post(target) as response:
                await response.read()

        side = [asyncio.create_task(trigger(at, target)) for at, target in events]
        for i in range(int(rate * duration_s)):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.time()))
            tasks.append(asyncio.create_task(send(i)))
        await asyncio.gather(*tasks, *side)
    return t0, records, snapshots


async def _b_records(b_base: str, t0: float) -> list[list[Any]]:
    async with aiohttp.ClientSession() as session, session.get(f"{b_base}/_chain/records") as r:
        raw = json.loads(await r.read())
    return [
        [a - t0, None if e is None else e - t0, busy, None if g is None else g - t0, s, i]
        for a, e, busy, g, s, i in raw
    ]


async def _b_reset(b_base: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(f"{b_base}/_chain/reset") as r:
        await r.read()


def run_one(mode: str, kind: str, phase_s: float, tmp: Path) -> dict[str, Any]:
    """One run (``trigger`` or ``overload``) of ``mode`` on fresh processes."""
    with processes(tmp) as procs:
        chain = start_chain(procs, mode)
        asyncio.run(offer(chain.url, mode, 5.0, 1.0, []))  # warm the connections (ids 0-4)
        asyncio.run(_b_reset(chain.b_base))
        cpu0 = {name: cpu_s(pid) for name, pid in chain.pids.items()}
        if kind == "trigger":
            rate, duration = 0.8 * B_CAPACITY_RPS, 3 * phase_s
            events = [(phase_s, f"{chain.b_base}/_chain/workers?n={B_WORKERS // 2}"),
                      (2 * phase_s, f"{chain.b_base}/_chain/workers?n={B_WORKERS}")]  # fmt: skip
        else:
            rate, duration, events = 3.0 * B_CAPACITY_RPS, phase_s, []
        if mode != "naive":  # A's own view (the client section) mid-trigger and at the end
            events += [(t, f"{chain.a_base}/_ballast/snapshot") for t in (1.5 * phase_s, duration)]
        load = os.getloadavg()[0]
        t0, client, snapshots = asyncio.run(offer(chain.url, mode, rate, duration, events))
        cpu = {name: round(cpu_s(pid) - cpu0[name], 2) for name, pid in chain.pids.items()}
        b = asyncio.run(_b_records(chain.b_base, t0))
    return {"mode": mode, "kind": kind, "rate": rate, "duration_s": duration, "phase_s": phase_s,
            "loadavg_1m": load, "cpu_s": cpu, "client": client, "b": b,
            "a_snapshots": snapshots}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--phase-s", type=float, default=10.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "chain.md")
    args = parser.parse_args(argv)
    from experiments.chain.report import render

    modes = [m for m in args.modes.split(",") if m]
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs = []
    for mode in modes:
        for kind in ("trigger", "overload"):
            print(f"chain: {mode} {kind} ...", flush=True)
            with tempfile.TemporaryDirectory(prefix="chain-") as logs:
                runs.append(run_one(mode, kind, args.phase_s, Path(logs)))
    doc = {"started": started, "machine": machine(), "b_capacity_rps": B_CAPACITY_RPS,
           "slo_s": SLO_S, "runs": runs}  # fmt: skip
    (args.out / "last_run.json").write_text(json.dumps(doc))
    args.doc.write_text(render(doc, args.doc.read_text() if args.doc.exists() else None))
    print(f"chain: wrote {args.doc}")
    return 0
