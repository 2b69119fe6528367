"""The open-loop load generator's command line.

Installed: ``ballast-load`` or ``python -m ballast_tools.loadgen``; from a
checkout also ``python -m loadgen`` (an alias package that is not shipped).

    python -m loadgen --target http://127.0.0.1:8080/ --rate 2000 --duration 20s

Prints the per-tier table; ``--json`` writes the summary (with the per-second
timeline), ``--records`` one JSON line per request. Exit status 0 even when
the target sheds (that is a result, not a failure); 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

import uvloop

from ballast_tools.loadgen.record import write_jsonl
from ballast_tools.loadgen.report import format_table, summarize
from ballast_tools.loadgen.runner import CLIENTS, LoadConfig, LoadRunner
from ballast_tools.loadgen.schedule import make_path_tiers, make_tiers
from ballast_tools.units import parse_duration_s


def _duration(text: str) -> float:
    try:
        return parse_duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _durations(text: str) -> list[float]:
    return [_duration(x) for x in text.split(",")]


def _paths(text: str) -> list[tuple[str, float, float]]:
    """``/fast=70:400ms,/slow=4:3s``: path=share:deadline per endpoint (issue 28)."""
    out = []
    for item in filter(None, text.split(",")):
        path, sep, rest = item.partition("=")
        share, colon, deadline = rest.partition(":")
        if not sep or not colon or not path.startswith("/"):
            raise argparse.ArgumentTypeError(f"--paths wants /PATH=SHARE:DEADLINE, got {item!r}")
        try:
            out.append((path, float(share), parse_duration_s(deadline)))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--paths {item!r}: {exc}") from None
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ballast-load", description=__doc__.split("\n")[0])
    p.add_argument("--target", required=True, help="URL to load (e.g. http://127.0.0.1:8080/)")
    p.add_argument("--rate", type=float, required=True, help="requests per second offered")
    p.add_argument("--duration", type=_duration, default=20.0, help="run length (20s)")
    p.add_argument("--poisson", action="store_true", help="Poisson arrivals (default constant)")
    p.add_argument("--seed", type=int, default=1, help="schedule seed (default 1)")
    p.add_argument("--mix", type=_floats, default=[5, 35, 60], help="tier weights (5,35,60)")
    p.add_argument("--deadlines", type=_durations, default=[0.4, 1.0, 3.0], help="(400ms,1s,3s)")
    p.add_argument("--paths", type=_paths, default=None,
                   help="path mix, e.g. /fast=70:400ms,/slow=4:3s")  # fmt: skip
    p.add_argument("--connections", type=int, default=8192, help="max in flight (8192)")
    p.add_argument("--max-lag", type=_duration, default=0.5, help="not issued beyond (500ms)")
    p.add_argument("--grace", type=_duration, default=0.05, help="wait past deadline (50ms)")
    p.add_argument("--method", default="GET", help="HTTP method (GET)")
    p.add_argument(
        "--warm", type=int, default=0, help="keep-alive connections to open before the start (0)"
    )
    p.add_argument(
        "--gc-during-run", action="store_true",
        help="leave the cyclic GC running while offering (default: paused, see runner.py)",
    )  # fmt: skip
    p.add_argument(
        "--client", choices=CLIENTS, default="lean", help="lean (http://, cheapest) or aiohttp"
    )
    p.add_argument("--json", dest="json_path", help="write the summary JSON here")
    p.add_argument("--records", help="write per-request JSONL records here")
    p.add_argument("--quiet", action="store_true", help="do not print the table")
    return p


def _config(args: argparse.Namespace) -> LoadConfig:
    return LoadConfig(
        target=args.target,
        rate_rps=args.rate,
        duration_s=args.duration,
        poisson=args.poisson,
        seed=args.seed,
        tiers=make_path_tiers(args.paths, args.mix)
        if args.paths
        else make_tiers(args.mix, args.deadlines),
        max_inflight=args.connections,
        max_lag_s=args.max_lag,
        grace_s=args.grace,
        method=args.method.upper(),
        keep_records=bool(args.records),
        client=args.client,
        warm_connections=args.warm,
        pause_gc=not args.gc_during_run,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        runner = LoadRunner(_config(args))
    except ValueError as exc:
        parser.error(str(exc))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop_runner:
        result = loop_runner.run(runner.run())
    summary = summarize(result)
    if not args.quiet:
        print(format_table(summary))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(summary, f, indent=1)
    if args.records and result.records is not None:
        with open(args.records, "w") as f:
            write_jsonl(result.records, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
