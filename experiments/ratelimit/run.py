"""``make experiment-ratelimit``: one limit across two gateways sharing Redis.

Starts a redis-server, a trivial upstream and pairs of ``uvicorn
ballast_asgi.gateway:app`` processes (one pair per configuration), drives them
open-loop from this process (the lean client on uvloop) over one key, and compares
what was admitted with a perfect single bucket replayed over the same
requests. Three phases, bounded in time (about four minutes at the default
scale); tables are printed and written into docs/ratelimit.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvloop

from experiments._harness.procs import Procs, free_port, processes
from experiments._harness.redis import RedisProcess, redis_server, start_redis
from experiments.ratelimit import analyze, report
from experiments.ratelimit.delayproxy import DelayProxy
from experiments.ratelimit.drive import build
from experiments.ratelimit.drive import run as drive
from experiments.ratelimit.plan import Run, Scale, section, shapes, zipf_section, zipf_shape
from experiments.ratelimit.procs import Pair, gateway_config, pairs, upstream

ROOT = Path(__file__).resolve().parents[2]
#: The gateways' ``redis_timeout_ms`` (the default), for the decision-wait check.
REDIS_TIMEOUT_S = 0.002


def measure(pair: Pair, run: Run, seed: int) -> dict[str, Any]:
    """Drive one run against ``pair``; return its row."""
    schedule = build(run.shape, seed)
    prefix = uuid.uuid4().hex[:8] + "-"
    before = pair.snapshots()
    cpu0 = pair.cpu()
    killer = None
    if run.kill_at_s is not None:
        killer = run.tags["redis"]
    at_kill: list[dict[str, Any]] = []
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        results, gen_cpu = runner.run(
            _drive(pair.bases, schedule, prefix, run, killer, pair.snapshots, at_kill)
        )
    gw_cpu = pair.cpu() - cpu0
    after = pair.snapshots()
    full = analyze.admission(results, run.limits)
    row: dict[str, Any] = {
        "table": run.table, "pair": pair.name, "scenario": run.scenario,
        "offered_rps": len(schedule) / run.shape.duration_s, "duration_s": run.shape.duration_s,
        "admission": full.__dict__ | {"net_pct": full.net_pct, "over_pct": full.over_pct},
        "p50_ms": analyze.latency_ms(results, 0.5), "p99_ms": analyze.latency_ms(results, 0.99),
        "max_ms": analyze.latency_ms(results, 1.0),
        "lag_p99_ms": analyze.lag_ms(results, 0.99), "not_issued": analyze.not_issued(results),
        "gen_cpu_share": gen_cpu / run.shape.duration_s,
        "gw_cpu_share": gw_cpu / run.shape.duration_s,
        "decisions": analyze.delta(before, after), **run.tags,
        # The pair serves this run's phase only; its gateways' slowest decision so far.
        "decision_wait_max_ms": max(
            (a["decision_wait"]["max_ms"] for a in after if a), default=0.0
        ),
    }  # fmt: skip
    if run.kill_at_s is not None:
        # From the kill on: the gateways' histograms read the moment Redis was killed.
        over, total = analyze.waits_over(at_kill or before, after, REDIS_TIMEOUT_S)
        row["decision_waits_over_timeout"] = [over, total]
        window = (run.kill_at_s, run.shape.duration_s)
        outage = analyze.admission(results, run.limits, window)
        outage_results = [r for r in results if window[0] <= r.offset_s]
        row["outage"] = outage.__dict__ | {
            "seconds": window[1] - window[0],
            "over_x_limit": max(0, outage.admitted - outage.perfect)
            / (run.limits.rate_per_s * (window[1] - window[0])),
            "max_ms": analyze.latency_ms(outage_results, 1.0),
            "p99_ms": analyze.latency_ms(outage_results, 0.99),
        }
    if run.scenario == "shifting":
        row["series"] = report.series(results, run.limits)
    return row


async def _drive(
    bases: list[str], schedule: list[tuple[float, int, str]], prefix: str, run: Run,
    killer: str | None, snapshots: Callable[[], list[dict[str, Any]]],
    at_kill: list[dict[str, Any]],
) -> tuple[list[Any], float]:  # fmt: skip
    if killer is None or run.kill_at_s is None:
        return await drive(bases, schedule, prefix)
    loop = asyncio.get_running_loop()
    taken: list[asyncio.Future[list[dict[str, Any]]]] = []

    def kill() -> None:
        _KILL[killer].kill()
        # Read the gateways' decision-wait histograms now, off the generator's loop.
        taken.append(loop.run_in_executor(None, snapshots))

    handle = loop.call_later(run.kill_at_s + 0.05, kill)
    try:
        return await drive(bases, schedule, prefix)
    finally:
        handle.cancel()
        if taken:
            at_kill.extend(await taken[0])


_KILL: dict[str, RedisProcess] = {}


def phase(
    rows: list[dict[str, Any]], procs: Procs, up: str, configs: dict[str, Any], runs: list[Run]
) -> None:
    """Start the pairs of one phase, run its runs in order, stop the pairs."""
    if not runs:
        return
    # Each pair is its own group of gateways: its own key prefix (buckets and heartbeats).
    configs = {n: c if c is None else {**c, "key_prefix": f"rl-{n}"} for n, c in configs.items()}
    with pairs({n: gateway_config(up, c) for n, c in configs.items()}, procs, procs.tmp) as started:
        time.sleep(1.0)  # heartbeats: let each gateway see its twin before measuring
        for i, run in enumerate(runs):
            if run.kill_at_s is not None:
                _restart(run.tags["redis"])
                time.sleep(0.6)  # let the breaker close again after the restart
            row = measure(started[run.pair], run, seed=1000 + i)
            rows.append(row)
            print(report.one_line(row), flush=True)


def _restart(name: str) -> None:
    server = _KILL[name]
    if server.proc.poll() is not None:
        _KILL[name] = start_redis(server.port)


def plan_runs(scale: Scale, lim: Any) -> tuple[list[Run], list[Run]]:
    """Phase 1 (table 1) and phase 2 (table 2) run lists, alternating configurations."""
    sh = shapes(scale)
    one: list[Run] = []
    for _ in range(scale.reps):
        one += [Run("t1a", p, "80%", sh["80%"], lim) for p in ("none", "redis", "lease", "sync")]
    for _ in range(scale.reps_150):
        one.append(Run("t1b", "none", "even", sh["even"], lim))
        one.append(Run("t1b", "local", "even", sh["even"], lim))
        for scenario in ("even", "shifting", "burst"):
            one += [Run("t1b", p, scenario, sh[scenario], lim) for p in ("redis", "lease", "sync")]
    two: list[Run] = []
    for _ in range(scale.breaker_reps):
        for p in ("redis-naive", "redis", "lease-naive", "lease"):
            two.append(Run("t2", p, "even", sh["even-short"], lim))
        for p in ("zipf-naive", "zipf"):
            two.append(Run("t2z", p, "zipf", zipf_shape(scale), scale.zipf_limits))
    return one, two


def main(argv: list[str] | None = None) -> int:
    """Run the three phases, print the tables, write docs/ratelimit.md."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every rate (default 1)")
    ap.add_argument("--quick", action="store_true", help="short runs, one repetition")
    ap.add_argument("--keep-burst", action="store_true", help="burst stays 100 when scaled")
    ap.add_argument("--no-docs", action="store_true", help="do not rewrite docs/ratelimit.md")
    ap.add_argument(
        "--only", nargs="+", choices=["local", "redis", "lease", "sync"], default=None,
        help="a subset: these modes' rows (and the no-limiter rows) only; prints the rows and "
        "the tables it has, leaves docs/ratelimit.md and last_run.json alone",
    )  # fmt: skip
    args = ap.parse_args(argv)
    scale = Scale(args.scale, keep_burst=args.keep_burst)
    if args.quick:
        scale = Scale(args.scale, short_s=2.0, even_s=3.0, reps=1, breaker_reps=1, reps_150=1,
                      keep_burst=args.keep_burst)  # fmt: skip
    lim = scale.limits
    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs, redis_server() as rd:
        up = upstream(procs)
        url = rd.url
        one, two = plan_runs(scale, lim)
        keep = Subset(args.only)
        phase(rows, procs, up, keep({
            "none": None,
            "local": {"mode": "local", "rate_per_s": lim.rate_per_s, "burst": lim.burst},
            **{m: section(scale, m, url) for m in ("redis", "lease", "sync")},
        }), [r for r in one if r.pair in keep.pairs])  # fmt: skip
        phase(rows, procs, up, keep({
            "redis": section(scale, "redis", url), "lease": section(scale, "lease", url),
            "redis-naive": section(scale, "redis", url, breaker={"kind": "naive"}),
            "lease-naive": section(scale, "lease", url, breaker={"kind": "naive"}),
            "zipf": zipf_section(scale, url, "rebuilt"),
            "zipf-naive": zipf_section(scale, url, "naive"),
        }), [r for r in two if r.pair in keep.pairs])  # fmt: skip
        rows += phase_three(scale, procs, up, rd, args.only)
    elapsed = time.monotonic() - started
    meta = _meta(scale, elapsed)
    if args.only:
        print(f"subset {args.only}: {len(rows)} runs in {elapsed:.0f} s, load {meta['loadavg']}")
        return 0
    text = report.render(rows, scale, meta)
    print(text)
    (ROOT / "experiments/ratelimit/last_run.json").write_text(json.dumps(
        {"meta": meta, "rows": rows}, indent=1, default=str))  # fmt: skip
    if not args.no_docs:
        report.write_docs(ROOT / "docs/ratelimit.md", text)
        report.plot(rows, ROOT / "docs/img/ratelimit_shifting.png", scale)
    return 0


class Subset:
    """Which pairs a run keeps (``--only``): the named modes' pairs and the no-limiter pair."""

    def __init__(self, modes: list[str] | None) -> None:
        self.modes = modes
        names = ["none", "local", "redis", "lease", "sync", "redis-naive", "lease-naive"]
        names += ["zipf", "zipf-naive"]
        self.pairs = {n for n in names if self._kept(n)}

    def _kept(self, name: str) -> bool:
        if self.modes is None or name == "none":
            return True
        base = name.split("-")[-1] if name.startswith(("slow-", "stop-")) else name.split("-")[0]
        return ("redis" if base == "zipf" else base) in self.modes

    def __call__(self, configs: dict[str, Any]) -> dict[str, Any]:
        """The configs of the kept pairs."""
        return {n: c for n, c in configs.items() if self._kept(n)}


def phase_three(
    scale: Scale, procs: Procs, up: str, redis: RedisProcess, only: list[str] | None = None
) -> list[dict[str, Any]]:
    """Redis 5 ms slower (delaying proxy) and Redis stopped mid-run."""
    rows: list[dict[str, Any]] = []
    sh = shapes(scale)
    modes = [m for m in ("redis", "lease", "sync") if only is None or m in only]
    if not modes:
        return rows
    proxy = DelayProxy(redis.port, 0.005).start()
    _KILL["b"] = start_redis(free_port())
    try:
        configs = {f"slow-{m}": section(scale, m, proxy.url) for m in modes}
        configs |= {f"stop-{m}": section(scale, m, _KILL["b"].url) for m in modes}
        runs: list[Run] = []
        for _ in range(scale.reps_150):
            runs += [Run("t3", f"slow-{m}", "slow", sh["even"], scale.limits)
                     for m in modes]  # fmt: skip
            runs += [Run("t3", f"stop-{m}", "stopped", sh["outage"], scale.limits,
                         kill_at_s=3.0, tags={"redis": "b"})
                     for m in modes]  # fmt: skip
        phase(rows, procs, up, configs, runs)
    finally:
        proxy.stop()
        _KILL.pop("b").stop()
    return rows


def _meta(scale: Scale, elapsed: float) -> dict[str, Any]:
    import os

    load = os.getloadavg()
    return {
        "python": sys.version.split()[0], "platform": platform.platform(),
        "cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in load],
        "scale": scale.factor, "elapsed_s": round(elapsed, 1),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
