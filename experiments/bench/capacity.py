"""The capacity cap's effect (issue 6 item 4): gateway RSS and critical p99 past the knee.

Backend: the upstream simulator (8 workers, 25 ms / 120 ms, about 270 rps).
Two gateways (gradient limiter, the queue at its largest, 10,000) differ only
in ``capacity.max_held_requests``: 1024 vs 1,000,000 (effectively none).
(The default cap, 4096, is above what the default queue and concurrency limit
can hold, 1,000 + 1,000: with defaults it is a backstop that never binds; the
bench widens the queue so that the cap is what bounds the gateway.)
Each is driven with the reference traffic (5/35/60 % critical/standard/
bulk, deadlines 400 ms / 1 s / 3 s) at 3x and then 12x the knee; after each
run the gateway's peak RSS so far (VmHWM), its RSS over time (sampled each
second), its CPU per request, and its snapshot (peak held requests) are kept.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import urllib.request
from typing import Any

from ballast_tools.loadgen.report import summarize
from ballast_tools.loadgen.runner import LoadConfig, LoadRunner
from experiments._harness.cpu import busy_share, cpu_s, cpu_ticks, status_kb
from experiments._harness.loop import HiResLoop
from experiments._harness.procs import Procs
from experiments._harness.servers import Target, start_gateway, start_sim

KNEE_RPS = 270.0
CAP_CONFIG = """
admission_queue:
  max_queue_size: 10000
capacity:
  max_held_requests: {cap}
"""
CAPS = {"cap-1024": 1024, "cap-unlimited": 1_000_000}


class RssSampler:
    """Samples VmRSS of one pid once a second in a thread (bounded by ``stop``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples_mb: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.samples_mb.append(status_kb(self.pid, "VmRSS") / 1024)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _snapshot(target: Target) -> dict[str, Any]:
    url = f"http://127.0.0.1:{target.port}/_ballast/snapshot"
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def run_one(target: Target, multiple: float, seconds: float) -> dict[str, Any]:
    """Drive ``target`` at ``multiple`` x the knee with the reference mix."""
    assert target.pid is not None
    cfg = LoadConfig(target=target.url, rate_rps=KNEE_RPS * multiple, duration_s=seconds)
    before, ticks = cpu_s(target.pid), cpu_ticks()
    with RssSampler(target.pid) as rss, asyncio.Runner(loop_factory=HiResLoop) as lp:
        result = lp.run(LoadRunner(cfg).run())
    used = cpu_s(target.pid) - before
    busy0, busy1 = busy_share(ticks, 0), busy_share(ticks, 1)
    s = summarize(result)
    crit = s["tiers"]["critical"]
    sent = s["generator"]["sent"]
    snap = _snapshot(target)
    return {
        "config": target.name,
        "multiple": multiple,
        "rate": cfg.rate_rps,
        "seconds": seconds,
        "critical_sent": crit["sent"],
        "critical_served": crit["served"],
        "critical_p99_ms": crit["latency_served_ms"]["p99"],
        "served_total": sum(t["served"] for t in s["tiers"].values()),
        "shed_total": sum(t["shed"] for t in s["tiers"].values()),
        "shed_by_reason": _merge(t["shed_by_reason"] for t in s["tiers"].values()),
        "sent": sent,
        "gen_lag_p99_ms": s["generator"]["schedule_lag_ms"]["p99"],
        "cpu_us_per_request": used / sent * 1e6 if sent else math.nan,
        "cpu_util": used / max(result.wall_s, 1e-9),
        "cpu0_busy": busy0,
        "cpu1_busy": busy1,
        "sent_share": sent / max(result.scheduled, 1),
        "vmhwm_mb": status_kb(target.pid, "VmHWM") / 1024,
        "rss_timeline_mb": [round(x, 1) for x in rss.samples_mb],
        "peak_held": (snap.get("capacity") or {}).get("peak_held"),
        "limit_end": snap["limiter"]["limit"],
    }


def _merge(dicts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def capacity_bench(
    procs: Procs, cpu_proxy: int, cpu_load: int, seconds_3x: float, seconds_12x: float
) -> list[dict[str, Any]]:
    """Both cap configs at 3x then 12x, alternating; processes stopped afterwards."""
    sim = start_sim(procs, cpu_load)
    gws = [
        start_gateway(
            procs, name, sim.base, cpu_proxy, CAP_CONFIG.format(cap=cap), "--limiter", "gradient"
        )
        for name, cap in CAPS.items()
    ]
    out = []
    try:
        for multiple, seconds in ((3.0, seconds_3x), (12.0, seconds_12x)):
            for gw in gws:
                row = run_one(gw, multiple, seconds)
                print(
                    f"  capacity {gw.name:14s} {multiple:4.0f}x: critical "
                    f"{row['critical_served']}/{row['critical_sent']} p99 "
                    f"{row['critical_p99_ms']} ms, VmHWM {row['vmhwm_mb']:.0f} MB, "
                    f"peak held {row['peak_held']}, {row['cpu_us_per_request']:.0f} us/req",
                    flush=True,
                )
                out.append(row)
    finally:
        for proc in list(procs.started):
            if proc.pid in {g.pid for g in gws} | {sim.pid}:
                procs.stop(proc)
    return out
