"""``python -m experiments.pool``: the pool experiment, one command (``make experiment-pool``).

Three instances behind the gateway, open-loop load, instance 0 broken for a
while in five ways, under four settings (probes only, passive only, retries
only, all three); then one setting at a time from the all-on default; then a
run with nothing broken but 1 % errors and log-normal delays everywhere,
counting false ejections. Medians of ``--reps`` runs. Writes
``<out>/results.json`` and ``<out>/pool.md`` (the tables) and prints them.

Scaled to a shared two-core machine: ``--rate`` (default 200 rps, the
reference's 2,000 / 10) and ``--break-s`` (default 3 s, the reference's
30 s / 10); the ten-minute run is ``--quiet-s`` long (default 40 s) x reps.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import uvloop

from experiments._harness.cpu import pin_self
from experiments._harness.machine import machine
from experiments._harness.procs import processes
from experiments.pool import report
from experiments.pool.drive import OTHER_CPU, Instances, Timing, run_once

FAULTS = ("down", "503", "reset", "brownout", "slow")
COLUMNS: dict[str, dict[str, Any]] = {
    "probes only": {"health": True, "outlier": False, "breaker": False, "retry": False},
    "passive only": {"health": False, "outlier": True, "breaker": True, "retry": False},
    "retries only": {"health": False, "outlier": False, "breaker": False, "retry": True},
    "all three": {"health": True, "outlier": True, "breaker": True, "retry": True},
}
#: One setting at a time from the all-on default: (label, YAML section, key, values).
SETTINGS: tuple[tuple[str, str, str, tuple[int, ...]], ...] = (
    ("probe interval (ms, default 500)", "health_check", "interval_ms", (100, 2_000)),
    ("consecutive failures (default 5)", "outlier", "consecutive_failures", (2, 20)),
    ("base ejection time (ms, default 5000)", "outlier", "base_ejection_ms", (1_000, 30_000)),
    ("retry attempts (default 3)", "retry", "max_attempts", (1, 5)),
)


def gateway_yaml(column: dict[str, Any], extra: dict[str, dict[str, int]] | None = None) -> str:
    """The gateway config: defaults, with the named mechanisms on or off."""
    extra = extra or {}
    hc = {"enabled": column["health"], **extra.get("health_check", {})}
    out = {"enabled": column["outlier"], **extra.get("outlier", {})}
    retry = {"enabled": column["retry"], **extra.get("retry", {})}
    doc = {
        "upstreams": {"per_instance_breaker": column["breaker"], "health_check": hc,
                      "outlier": out},
        "retry": retry,
    }  # fmt: skip
    return json.dumps(doc) + "\n"  # JSON is YAML


async def _cells(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    timing = Timing(args.rate, args.warm_s, args.break_s, args.tail_s)
    doc: dict[str, Any] = {"breaks": {}, "settings": {}, "quiet": []}
    with processes(work) as procs:
        inst = Instances(procs)
        for fault in args.faults:
            for name in args.columns:
                runs = [await run_once(procs, inst, gateway_yaml(COLUMNS[name]), fault, timing,
                                       rep + 1, work) for rep in range(args.reps)]  # fmt: skip
                doc["breaks"].setdefault(fault, {})[name] = runs
                report.progress(f"{fault:9s} {name:13s}", runs)
        for label, section, key, values in SETTINGS if args.settings else ():
            for value in values:
                yaml = gateway_yaml(COLUMNS["all three"], {section: {key: value}})
                runs = [await run_once(procs, inst, yaml, args.settings_fault, timing, rep + 1,
                                       work) for rep in range(args.reps)]  # fmt: skip
                doc["settings"].setdefault(label, {})[str(value)] = runs
                report.progress(f"{key}={value}", runs)
    if args.quiet_s > 0:
        doc["quiet"] = await _quiet(args, work)
    return doc


async def _quiet(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Nothing broken; 1 % errors and log-normal delays (sigma 1) everywhere."""
    timing = Timing(args.rate, args.quiet_s, 0.0, 0.0)
    runs = []
    with processes(work) as procs:
        inst = Instances(procs, error_rate=0.01, sigma=1.0)
        for rep in range(args.reps):
            runs.append(await run_once(procs, inst, gateway_yaml(COLUMNS["all three"]), None,
                                       timing, 100 + rep, work))  # fmt: skip
            report.progress("quiet", runs[-1:])
    return runs


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.pool", description=__doc__)
    p.add_argument("--rate", type=float, default=200.0, help="offered rps (200)")
    p.add_argument("--warm-s", type=float, default=1.0)
    p.add_argument("--break-s", type=float, default=3.0)
    p.add_argument("--tail-s", type=float, default=0.5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--faults", nargs="*", default=list(FAULTS), choices=FAULTS)
    p.add_argument("--columns", nargs="*", default=list(COLUMNS), choices=list(COLUMNS))
    p.add_argument("--no-settings", dest="settings", action="store_false")
    p.add_argument("--settings-fault", default="down", choices=FAULTS)
    p.add_argument("--quiet-s", type=float, default=40.0, help="no-fault run length (40)")
    p.add_argument("--out", type=Path, default=Path("experiments/pool/out"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run everything asked for; write results.json and pool.md into ``--out``."""
    args = _parser().parse_args(argv)
    pin_self(OTHER_CPU)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="pool-exp-") as tmp,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        doc = runner.run(_cells(args, Path(tmp)))
    doc["meta"] = {
        "rate_rps": args.rate, "warm_s": args.warm_s, "break_s": args.break_s,
        "tail_s": args.tail_s, "reps": args.reps, "quiet_s": args.quiet_s,
        "settings_fault": args.settings_fault, "wall_s": round(time.monotonic() - started, 1),
        "machine": machine(),
    }  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(doc, indent=1))
    text = report.markdown(doc)
    (args.out / "pool.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
