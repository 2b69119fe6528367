"""Where an over-admission comes from: the perfect bucket over send times and over decision times.

``python -m experiments.ratelimit.decisiontimes [--modes sync lease] [--reps 3] [--seconds 5]``
starts a redis-server, the trivial upstream and one pair of traced gateways per
mode (``traced.py``: each gateway records when every request reached it), and
offers 150 % of the limit under an even split, as the experiment's even row does.
For every run it prints admitted against a perfect single bucket replayed

- over the generator's intended send times (the experiment's reading), and
- over the moments the gateways decided (merged from both gateways' traces,
  one clock: ``CLOCK_MONOTONIC``),

and how late the gateways decided (decision time minus intended send time,
relative to the earliest request of the run): a gateway that falls further
behind during the run decides over a longer stretch of time than the schedule,
and a correct bucket admits ``rate`` times that extra stretch.

``--kill-at S`` kills the pairs' Redis ``S`` seconds into each run (restarted
before the next) and prints where the decisions slower than the 2 ms Redis
timeout spent their time (``traced.py`` times each one in wall-clock and CPU
time and counts the garbage collections inside it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import uvloop

from ballast_asgi.ratelimit.core.gcra import Limits, ReferenceBucket
from experiments._harness.procs import free_port, processes
from experiments._harness.redis import RedisProcess, redis_server, start_redis
from experiments.ratelimit import analyze
from experiments.ratelimit.drive import Result, Shape, build
from experiments.ratelimit.drive import run as drive
from experiments.ratelimit.plan import Scale, section
from experiments.ratelimit.procs import gateway_config, pairs, upstream

#: The gateways' ``redis_timeout_ms`` (the default): the bound a decision should keep.
BOUND_MS = 2.0


def _trace(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + "/_trace", timeout=5.0) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    doc["requests"] = [tuple(r) for r in doc["requests"]]
    return doc


def slow_summary(docs: list[dict[str, Any]], since: float) -> str:
    """Decisions over ``BOUND_MS`` from ``since`` on (monotonic), split by where the time went."""
    slow = [s for d in docs for s in d["slow"] if s[0] >= since and s[1] > BOUND_MS]
    total = sum(d["decisions"] for d in docs)
    busy = [s for s in slow if s[2] >= 0.5 * s[1]]
    with_gc = [s for s in slow if s[3] > 0 and s[4] >= 0.5 * s[1]]
    pauses = [p for d in docs for p in d["pauses"] if p[0] >= since and p[2] > BOUND_MS]
    worst = max((s[1] for s in slow), default=0.0)
    return (
        f"{len(slow)} of {total} decisions over {BOUND_MS:g} ms (max {worst:.1f} ms): "
        f"{len(busy)} mostly CPU in the process ({len(with_gc)} mostly a garbage collection), "
        f"{len(slow) - len(busy)} mostly not running (preempted); collections over "
        f"{BOUND_MS:g} ms: {len(pauses)} (max {max((p[2] for p in pauses), default=0.0):.1f} ms, "
        f"generations {sorted({p[1] for p in pauses})}); all collections "
        f"{sum(d['collections'] for d in docs)} taking {sum(d['gc_ms'] for d in docs):.0f} ms"
    )


def decision_reading(
    results: list[Result], schedule: list[tuple[float, int, str]],
    traces: list[list[tuple[int, float, int]]], limits: Limits,
) -> dict[str, Any]:  # fmt: skip
    """Admitted vs perfect over the gateways' decision times, and the gateways' lateness."""
    slot_of = {offset: i for i, (offset, _, _) in enumerate(schedule)}
    reason = {slot_of[r.offset_s]: r.reason for r in results}
    decided = sorted(
        (t, seq, status, gw) for gw, trace in enumerate(traces) for seq, t, status in trace
        if status == 200 or (status == 429 and reason.get(seq) == "rate_limited")
    )  # fmt: skip
    bucket = ReferenceBucket(limits, decided[0][0])
    admitted = perfect = 0
    per_gw = [0, 0]
    marks = [0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 11.0]
    excess: list[str] = []
    t0 = decided[0][0]
    for t, _, status, gw in decided:
        while marks and t - t0 >= marks[0]:
            excess.append(f"{marks.pop(0):g}s:{admitted - perfect:+d}")
        perfect += bucket.take(t)
        admitted += status == 200
        per_gw[gw] += status == 200
    late = [(t - schedule[seq][0], schedule[seq][0], gw) for t, seq, _, gw in decided]
    base = min(x for x, _, _ in late)
    duration = schedule[-1][0]

    def mean_late(lo: float, hi: float) -> float:
        vals = [x - base for x, off, _ in late if lo <= off < hi]
        return 1000.0 * statistics.fmean(vals) if vals else float("nan")

    lateness = sorted(x - base for x, _, _ in late)
    return {
        "admitted": admitted, "perfect": perfect,
        "net_pct": 100.0 * (admitted - perfect) / max(1, perfect),
        "late_p50_ms": 1000.0 * lateness[len(lateness) // 2],
        "late_p99_ms": 1000.0 * lateness[int(0.99 * len(lateness))],
        "late_first_ms": mean_late(0.0, 0.25), "late_last_ms": mean_late(duration - 0.25, duration),
        "span_s": decided[-1][0] - decided[0][0], "schedule_s": duration,
        "per_gw": per_gw, "excess": " ".join(excess),
    }  # fmt: skip


def _one(
    bases: list[str], mode: str, rep: int, shape: Shape, lim: Limits, kill_at: float | None,
    killable: list[RedisProcess],
) -> None:  # fmt: skip
    """One run: drive, read both gateways' traces, print the readings."""
    schedule = build(shape, 1000 + rep)
    prefix = uuid.uuid4().hex[:8] + "-"
    killed: list[float] = []

    async def go() -> list[Result]:
        if kill_at is not None:

            def kill() -> None:
                killed.append(time.monotonic())
                killable[0].kill()

            asyncio.get_running_loop().call_later(kill_at + 0.05, kill)
        results, _ = await drive(bases, schedule, prefix, seq=True)
        return results

    started = time.monotonic()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        results = runner.run(go())
    docs = [_trace(b) for b in bases]
    sent = analyze.admission(results, lim)
    row = decision_reading(results, schedule, [d["requests"] for d in docs], lim)
    print(
        f"{mode} rep {rep}: send times {sent.net_pct:+.2f} % "
        f"(admitted {sent.admitted}, perfect {sent.perfect}, other {sent.other}); "
        f"decision times {row['net_pct']:+.2f} % (admitted {row['admitted']}, "
        f"perfect {row['perfect']}); late p50 {row['late_p50_ms']:.1f} p99 "
        f"{row['late_p99_ms']:.1f} ms, first 0.25 s {row['late_first_ms']:.1f} "
        f"last 0.25 s {row['late_last_ms']:.1f} ms; span {row['span_s']:.3f} s "
        f"for {row['schedule_s']:.3f} s; per gateway {row['per_gw']}; "
        f"admitted - perfect at {row['excess']}",
        flush=True,
    )
    if killed:
        cut = killed[0]
        before = [
            {**d, "slow": [x for x in d["slow"] if x[0] < cut],
             "pauses": [x for x in d["pauses"] if x[0] < cut]}
            for d in docs
        ]  # fmt: skip
        print(f"  before the kill (count: whole run): {slow_summary(before, started)}")
        print(f"  after the kill: {slow_summary(docs, killed[0])}", flush=True)
    else:
        print(f"  {slow_summary(docs, started)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Run the even split at 150 % for each mode, ``reps`` times, alternating; print each run."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", nargs="+", default=["sync", "lease"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--kill-at", type=float, default=None, help="kill Redis this far into runs")
    args = ap.parse_args(argv)
    scale = Scale()
    lim = scale.limits
    shape = Shape(1.5 * lim.rate_per_s, args.seconds)
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs, redis_server() as rd:
        up = upstream(procs)
        killable = [start_redis(free_port())] if args.kill_at is not None else []
        url = killable[0].url if killable else rd.url
        configs = {m: gateway_config(up, {**section(scale, m, url), "key_prefix": f"rl-{m}"})
                   for m in args.modes}  # fmt: skip
        try:
            with pairs(configs, procs, procs.tmp, app="experiments.ratelimit.traced:app") as pp:
                time.sleep(1.0)
                for rep in range(args.reps):
                    for mode in args.modes:
                        if killable and killable[0].proc.poll() is not None:
                            killable[0] = start_redis(killable[0].port)
                            time.sleep(0.6)  # the breaker closes again
                        _one(pp[mode].bases, mode, rep, shape, lim, args.kill_at, killable)
        finally:
            for server in killable:
                server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
