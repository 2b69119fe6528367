"""The programmable backend's command line.

Installed: ``ballast-upstream`` or ``python -m ballast_tools.upstream_sim``;
from a checkout also ``python -m upstream_sim`` (an alias package, not shipped).

    python -m upstream_sim --port 9101 --admin-port 9102 --workers 8 --fast 25ms --slow 120ms

Traffic on ``--port``; ``/profile``, ``/stats``, ``/stats/reset``, ``/health``
on ``--admin-port``; both in one process on one uvloop loop. SIGINT/SIGTERM
stop it cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence
from typing import Any

import uvloop

from ballast_tools.units import parse_duration_s
from ballast_tools.upstream_sim.model import MAX_PATH_CLASSES, PathClass, Profile
from ballast_tools.upstream_sim.server import start_sim


def _duration(text: str) -> float:
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _paths(text: str) -> tuple[PathClass, ...]:
    """``"/fast=1x2ms,/slow=9x1s"``: path classes (prefix=WORKERSxSERVICE)."""
    out = []
    for item in filter(None, text.split(",")):
        prefix, sep, spec = item.partition("=")
        workers, x, service = spec.partition("x")
        if not sep or not x:
            raise argparse.ArgumentTypeError(f"--paths wants PREFIX=WORKERSxSERVICE, got {item!r}")
        try:
            out.append(PathClass(prefix, int(workers), parse_duration_s(service)))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--paths {item!r}: {exc}") from None
    if len(out) > MAX_PATH_CLASSES:
        raise argparse.ArgumentTypeError(f"--paths holds at most {MAX_PATH_CLASSES} classes")
    return tuple(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ballast-upstream", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=9101, help="traffic port (default 9101)")
    p.add_argument("--admin-port", type=int, default=9102, help="admin port (default 9102)")
    p.add_argument("--workers", type=int, default=8, help="worker count (default 8)")
    p.add_argument("--fast", type=_duration, default=0.025, help="fast service (default 25ms)")
    p.add_argument("--slow", type=_duration, default=0.120, help="slow service (default 120ms)")
    p.add_argument("--slow-fraction", type=float, default=0.05, help="share of slow (0.05)")
    p.add_argument("--latency-multiplier", type=float, default=1.0, help="scale service times")
    p.add_argument("--error-rate", type=float, default=0.0, help="share answered with an error")
    p.add_argument("--error-status", type=int, default=500, help="status of errors (500)")
    p.add_argument("--drop-expired", action="store_true", help="skip requests past deadline")
    p.add_argument("--paths", type=_paths, default=(),
                   help="endpoint classes, e.g. /fast=1x2ms,/slow=9x1s")  # fmt: skip
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--log-level", default="warning", help="uvicorn log level (warning)")
    p.add_argument("--register-etcd", metavar="URL", help="register in etcd (docs/discovery.md)")
    p.add_argument("--service", help="service name to register under (with --register-etcd)")
    p.add_argument("--version", default="", help="release label to register (with --register-etcd)")
    p.add_argument("--ttl", type=int, default=5, help="registration lease TTL s (default 5)")
    return p


def _profile(args: argparse.Namespace) -> Profile:
    return Profile(
        workers=args.workers,
        fast_s=args.fast,
        slow_s=args.slow,
        slow_fraction=args.slow_fraction,
        latency_multiplier=args.latency_multiplier,
        error_rate=args.error_rate,
        error_status=args.error_status,
        drop_expired=args.drop_expired,
        paths=args.paths,
    )


async def _serve(args: argparse.Namespace, profile: Profile) -> None:
    running = await start_sim(
        profile,
        seed=args.seed,
        host=args.host,
        port=args.port,
        admin_port=args.admin_port,
        log_level=args.log_level,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"upstream_sim: traffic {running.url}  admin {running.admin_url}  "
        f"capacity ~{profile.capacity_rps:.0f} rps",
        file=sys.stderr,
        flush=True,
    )
    registration = _registration(args, running.url)
    try:
        await stop.wait()
    finally:
        if registration is not None:  # deregister first: no new traffic, then stop serving
            await registration(stop)
        await running.stop()


def _registration(args: argparse.Namespace, url: str) -> Any:
    """Start registering ``url`` in etcd; returns the coroutine function that deregisters."""
    if not args.register_etcd:
        return None
    from ballast_asgi.discovery.simulator import register_in_background

    return register_in_background(
        args.register_etcd, args.service, url, version=args.version, ttl_s=args.ttl
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.register_etcd:
        from ballast_asgi.discovery.simulator import check_args

        problem = check_args(args.register_etcd, args.service, args.version, args.ttl)
        if problem:
            parser.error(problem)
    try:
        profile = _profile(args)
    except ValueError as exc:
        print(f"ballast-upstream: {exc}", file=sys.stderr)
        return 2
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_serve(args, profile))
    except OSError as exc:
        print(f"ballast-upstream: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
