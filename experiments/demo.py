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
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import aiohttp
import uvloop

from experiments.exp_one import get_json
from loadgen.report import format_table, summarize
from loadgen.runner import LoadConfig, LoadRunner, RunResult
from loadgen.units import parse_duration_s

HOST = "127.0.0.1"
READY_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0


def free_port() -> int:
    """A currently free loopback TCP port."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class Child:
    """A child process with its output captured in a temporary file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: IO[bytes]

    def log_tail(self, n_bytes: int = 2000) -> str:
        """The end of the child's output."""
        self.log.flush()
        self.log.seek(0, os.SEEK_END)
        self.log.seek(max(0, self.log.tell() - n_bytes))
        return self.log.read().decode(errors="replace")


@dataclass
class Children:
    """Every process the demo started; ``stop_all`` ends them by PID."""

    items: list[Child] = field(default_factory=list)

    def start(self, name: str, argv: list[str]) -> Child:
        """Start ``argv`` in its own session (Ctrl-C reaches only the demo)."""
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop_all
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        child = Child(name, proc, log)
        self.items.append(child)
        return child

    def stop_all(self) -> None:
        """SIGTERM each child, wait, SIGKILL the ones still alive, reap all."""
        for c in self.items:
            if c.proc.poll() is None:
                c.proc.terminate()
        for c in self.items:
            try:
                c.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
            c.log.close()


async def wait_ready(child: Child, url: str, session: aiohttp.ClientSession) -> None:
    """Poll ``url`` until it answers 200; fail early if the child exits."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + READY_TIMEOUT_S
    while loop.time() < give_up:
        if child.proc.poll() is not None:
            raise RuntimeError(f"{child.name} exited early:\n{child.log_tail()}")
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"{child.name} not ready after {READY_TIMEOUT_S:.0f}s:\n{child.log_tail()}")


@dataclass
class Ports:
    """The four loopback ports of one demo."""

    sim: int = field(default_factory=free_port)
    sim_admin: int = field(default_factory=free_port)
    gw: int = field(default_factory=free_port)
    gw_admin: int = field(default_factory=free_port)


def sim_argv(args: argparse.Namespace, ports: Ports) -> list[str]:
    """Command line of the simulator."""
    return [
        *(sys.executable, "-m", "upstream_sim", "--host", HOST),
        *("--port", str(ports.sim), "--admin-port", str(ports.sim_admin)),
        *("--workers", str(args.workers), "--fast", args.fast, "--slow", args.slow),
        *("--seed", str(args.seed)),
    ]


def gateway_argv(args: argparse.Namespace, ports: Ports) -> list[str]:
    """Command line of the gateway."""
    argv = [
        *(sys.executable, "-m", "ballast_asgi.cli", "--upstream", f"http://{HOST}:{ports.sim}"),
        *("--limiter", args.limiter, "--host", HOST),
        *("--port", str(ports.gw), "--admin-port", str(ports.gw_admin)),
    ]
    if args.fixed_limit is not None:
        argv += ["--fixed-limit", str(args.fixed_limit)]
    return argv


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
        else:
            print(" | ".join(frame[:2] + frame[3:4]), flush=True)

    def limit_line(self) -> str:
        """The range the gateway's limit moved through."""
        if not self.limits:
            return "gateway limit: not observed"
        return f"gateway limit moved between {min(self.limits):g} and {max(self.limits):g}"


async def run_demo(args: argparse.Namespace, children: Children) -> int:
    """Start everything, show the live view for the duration, print the summary."""
    ports = Ports()
    main_task = asyncio.current_task()
    assert main_task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    async with aiohttp.ClientSession() as http:
        sim = children.start("upstream_sim", sim_argv(args, ports))
        gw = children.start("gateway", gateway_argv(args, ports))
        await wait_ready(sim, f"http://{HOST}:{ports.sim_admin}/health", http)
        await wait_ready(gw, f"http://{HOST}:{ports.gw}/_ballast/health", http)
        runner = LoadRunner(
            LoadConfig(
                target=f"http://{HOST}:{ports.gw}/",
                rate_rps=args.rate,
                duration_s=args.duration,
                seed=args.seed,
            )
        )
        view = LiveView(runner, http, f"http://{HOST}:{ports.gw_admin}/snapshot", args)
        result = await view.run_with(runner.run())
        sim_stats = await get_json(http, f"http://{HOST}:{ports.sim_admin}/stats")
    print_summary(result, view, sim_stats)
    return 0


def print_summary(result: RunResult, view: LiveView, sim_stats: dict[str, Any] | None) -> None:
    """The final per-tier table and what the gateway and the backend did."""
    summary = summarize(result)
    crit = summary["tiers"]["critical"]
    print("\n== summary ==")
    print(format_table(summary))
    print(f"critical served {crit['served']} / {crit['sent']} sent")
    print(view.limit_line())
    if sim_stats:
        print(
            f"upstream: served {sim_stats['served']}, finished after deadline "
            f"{sim_stats['finished_after_deadline']}, max queue {sim_stats['max_queue_len']}"
        )


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
    children = Children()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(run_demo(args, children))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted: stopping the simulator and the gateway", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        children.stop_all()


if __name__ == "__main__":
    sys.exit(main())
