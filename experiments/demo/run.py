"""``make demo``: simulator + gateway + open-loop load, with a live terminal view.

    python -m experiments.demo --duration 30 [--rate 1000] [--limiter gradient]

Starts the upstream simulator (8 workers, 25 ms / 120 ms, ~269 rps) and the
gateway as child processes on free loopback ports, waits until both answer
(polling, bounded), runs the load generator in this process at several times
the simulator's capacity (1000 rps ~ 3.7x by default), redraws a per-tier view
once a second (served/shed per second, served p99, the gateway's limit and
in-flight), prints a summary and stops every process it started: terminate,
wait, kill if needed, also on Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from ballast_tools.loadgen.report import format_table, summarize
from ballast_tools.loadgen.runner import LoadConfig, LoadRunner, RunResult
from ballast_tools.units import parse_duration_s
from experiments._harness.jsonio import get_json, wait_ok
from experiments._harness.procs import Procs
from experiments._harness.servers import start_gateway, start_sim


class LiveView:
    """Redraws the per-tier view once a second while the load runs."""

    def __init__(
        self, runner: LoadRunner, http: aiohttp.ClientSession, snapshot_url: str, args: Any
    ) -> None:
        self.runner, self.http, self.snapshot_url = runner, http, snapshot_url
        self.title = f"ballast demo: {args.rate:g} rps offered, limiter {args.limiter}"
        self.limits: list[float] = []
        self._last = [(0, 0) for _ in runner.schedule.tiers]
        self.tty = sys.stdout.isatty()

    async def run_with(self, load: Any) -> RunResult:
        """Await ``load`` (the runner's coroutine), drawing every second."""
        task: asyncio.Task[RunResult] = asyncio.ensure_future(load)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=1.0)
                await self.draw()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return task.result()

    async def _gateway_line(self) -> str:
        snap = await get_json(self.http, self.snapshot_url)
        if snap is None:
            return "gateway: (no snapshot)"
        lim = snap.get("limiter", {})
        if isinstance(lim.get("limit"), int | float):
            self.limits.append(lim["limit"])
        queue = snap.get("queue", {}).get("total", "?")
        return f"gateway: limit {lim.get('limit')}  inflight {lim.get('inflight')}  queue {queue}"

    def _tier_lines(self) -> list[str]:
        stats = self.runner.stats
        window = stats.take_window()
        lines = [f"{'tier':<9}{'served/s':>9}{'shed/s':>8}{'p99 ms':>8}{'served':>9}{'sent':>8}"]
        for i, (tier, t) in enumerate(zip(stats.tiers, stats.tally, strict=True)):
            served0, shed0 = self._last[i]
            self._last[i] = (t.served, t.shed_total)
            p99 = f"{window[i].quantile(0.99) * 1e3:.0f}" if window[i].count else "-"
            lines.append(
                f"{tier.name:<9}{t.served - served0:>9}{t.shed_total - shed0:>8}{p99:>8}"
                f"{t.served:>9}{t.sent:>8}"
            )
        return lines

    async def draw(self) -> None:
        """One frame: header, gateway state, per-tier rows, generator health."""
        gw = await self._gateway_line()
        stats = self.runner.stats
        lag_ms = stats.lag_s.quantile(0.99) * 1e3 if stats.lag_s.count else 0.0
        not_issued = sum(t.not_issued for t in stats.tally)
        duration_s = self.runner.config.duration_s
        elapsed = f"t={min(self.runner.elapsed_s, duration_s):4.0f}s / {duration_s:g}s"
        if self.runner.elapsed_s > duration_s:
            elapsed += " (waiting for the last responses)"
        frame = [
            f"{self.title}   {elapsed}",
            gw,
            *self._tier_lines(),
            f"generator: lag p99 {lag_ms:.1f} ms, not issued {not_issued}",
        ]
        if self.tty:
            print("\x1b[H\x1b[2J" + "\n".join(frame), flush=True)
        else:  # a log or a pipe: every frame in full (header and every tier), one after another
            print("\n".join(frame) + "\n", flush=True)

    def limit_line(self) -> str:
        """The range the gateway's limit moved through."""
        if not self.limits:
            return "gateway limit: not observed"
        return f"gateway limit moved between {min(self.limits):g} and {max(self.limits):g}"


async def run_demo(args: argparse.Namespace, procs: Procs) -> int:
    """Start everything, show the live view for the duration, print the summary."""
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    sim = start_sim(procs, None, workers=args.workers, fast_ms=parse_duration_s(args.fast) * 1e3,
                    slow_ms=parse_duration_s(args.slow) * 1e3, seed=args.seed)  # fmt: skip
    limiter = ["--limiter", args.limiter]
    if args.fixed_limit is not None:
        limiter += ["--fixed-limit", str(args.fixed_limit)]
    gw = start_gateway(procs, "gateway", sim.base, None, None, *limiter)
    async with aiohttp.ClientSession() as http:
        await wait_ok(http, f"{sim.admin}/health")
        await wait_ok(http, f"{gw.base}/_ballast/health")
        runner = LoadRunner(
            LoadConfig(
                target=f"{gw.base}/",
                rate_rps=args.rate,
                duration_s=args.duration,
                seed=args.seed,
            )
        )
        view = LiveView(runner, http, f"{gw.admin}/snapshot", args)
        result = await view.run_with(runner.run())
        sim_stats = await get_json(http, f"{sim.admin}/stats")
    print_summary(result, view, sim_stats)
    return 0


def print_summary(result: RunResult, view: LiveView, sim_stats: dict[str, Any] | None) -> None:
    """The final per-tier table, what each count means, and what the gateway and backend did."""
    summary = summarize(result)
    crit = summary["tiers"]["critical"]
    print("\n== summary ==")
    table = format_table(summary).splitlines()  # the per-tier rows; the dicts below in words
    print("\n".join(ln for ln in table if not ln.startswith(("  ", "generator:"))))
    for line in outcome_lines(summary):
        print(line)
    print(f"critical served {crit['served']} / {crit['sent']} sent")
    print(view.limit_line())
    if sim_stats:
        print(
            f"upstream: served {sim_stats['served']}, finished after deadline "
            f"{sim_stats['finished_after_deadline']}, max queue {sim_stats['max_queue_len']}"
        )
    print(LEGEND)


#: What the summary's words mean (printed under it).
LEGEND = """
what the columns mean:
  served   answered 2xx within the tier's deadline (critical 400 ms, standard 1 s, bulk 3 s)
  shed     refused by the gateway (429, X-Ballast-Reason says why) before any upstream
           work. 'deadline': the request's X-Deadline-Ms budget ran out while it
           waited in the gateway's queue (or before it arrived): the gateway drops it rather
           than send the upstream work for a client that has given up. Standard and bulk
           wait behind critical, so at several times the capacity they are the ones
           shed this way; 'queue_full' / 'queue_timeout': no room or no permit in time
  expired  the client's deadline passed anyway: a late 2xx ('late'), a local timeout
           ('timeout'), or a 504 from the gateway when the budget ran out at the upstream
  errors   any other status or a transport error
  not_iss  the load generator itself fell behind and never sent these (its failure, not
           the gateway's)"""


def outcome_lines(summary: dict[str, Any]) -> list[str]:
    """Per tier, the sheds by reason, the expiries and errors by kind, in words."""
    lines = []
    for name, t in summary["tiers"].items():
        parts = [
            f"{label} {_counts(t[key])}"
            for label, key in (
                ("shed", "shed_by_reason"),
                ("expired", "expired_by"),
                ("errors", "errors_by"),
            )
            if t[key]
        ]
        if parts:
            lines.append(f"  {name}: " + "; ".join(parts))
    g = summary["generator"]
    lines.append(
        f"generator: sent {g['sent']} of {g['scheduled']} scheduled ({g['achieved_rps']} rps), "
        f"not issued {g['not_issued']}"
    )
    return lines


def _counts(counts: dict[str, int]) -> str:
    """``{"deadline": 812, "queue_full": 30}`` as ``812 deadline, 30 queue_full``."""
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.demo", description=__doc__)
    p.add_argument("--duration", type=parse_duration_s, default=30.0, help="seconds (30)")
    p.add_argument("--rate", type=float, default=1000.0, help="offered rps (1000 ~ 3.7x)")
    p.add_argument("--limiter", default="gradient", help="gateway limiter (gradient)")
    p.add_argument("--fixed-limit", type=int, default=None, help="limit for --limiter fixed")
    p.add_argument("--workers", type=int, default=8, help="simulator workers (8)")
    p.add_argument("--fast", default="25ms", help="fast service time (25ms)")
    p.add_argument("--slow", default="120ms", help="slow service time (120ms)")
    p.add_argument("--seed", type=int, default=1, help="seed for simulator and schedule (1)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; always stop the children, also on Ctrl-C / SIGTERM."""
    args = _parser().parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="ballast-demo-")
    procs = Procs(Path(tmp.name))
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(run_demo(args, procs))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: stopping the simulator and the gateway", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        procs.stop_all()
        tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
