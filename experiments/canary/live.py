"""The live run: ``uvicorn ballast_asgi.gateway:app`` in front of two simulators, open-loop load.

Three scenarios at 100 rps (Poisson, the default tier mix) with the canary at
weight 0.1 and the sequential rule at alpha 0.01; stable fails 1 % of
requests in each:

* ``+5 pp errors``: the canary fails 6 %; runs until rolled back (at most 180 s);
* ``3x latency``: the canary serves 3x slower (25 -> 75 ms fast path);
* ``identical``: the canary is the same; runs ``good_s`` (10 minutes).

The state is polled from ``GET /_ballast/canary`` every second. After a
rollback the load continues for 5 s and the canary simulator's ``served``
counter shows whether it still got traffic.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from experiments._harness.procs import HOST, Procs, free_port, processes
from experiments._harness.servers import Target, sim_cmd

RATE_RPS = 100
WEIGHT = 0.1
#: The warm start's history, shortened so the live run shows the judge learning (the default
#: is 10 minutes, and 200 events, which a 100 rps stable side at 1 % has after 200 s).
HISTORY_MS = 30_000
HISTORY_MIN_EVENTS = 20


def _simulator(procs: Procs, name: str, error_rate: float, multiplier: float, seed: int) -> Target:
    """A simulator (32 workers, 25 / 120 ms) failing ``error_rate``, ``multiplier`` slower."""
    port, admin = free_port(), free_port()
    cmd = sim_cmd(port, admin, workers=32, seed=seed)
    cmd += ["--error-rate", str(error_rate), "--latency-multiplier", str(multiplier)]
    proc = procs.start(cmd, None, port, name)
    return Target(name, port, proc.pid, path="/", admin_port=admin)


def _served(sim: Target) -> int:
    return int(httpx.get(sim.admin + "/stats", timeout=5).json()["served"])


def run_scenario(
    name: str, canary_error: float, canary_mult: float, seconds: float,
    history_ms: int = HISTORY_MS,
) -> dict[str, Any]:  # fmt: skip
    """One scenario; the last polled state and the outcome."""
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs:
        stable = _simulator(procs, "stable", 0.01, 1.0, 1)
        canary = _simulator(procs, "canary", canary_error, canary_mult, 2)
        config = Path(tmp) / "ballast.yaml"
        config.write_text(f"upstream: {stable.base}\nmax_concurrent_requests: 256\n"
                          f"canary:\n  upstream: {canary.base}\n  weight: {WEIGHT}\n"
                          "  rule: sequential\n  alpha: 0.01\n"
                          f"  sequential:\n    history:\n      history_ms: {history_ms}\n"
                          f"      min_events: {HISTORY_MIN_EVENTS}\n")  # fmt: skip
        port = free_port()
        env = {"BALLAST_CONFIG": str(config), "BALLAST_UPSTREAM": "", "BALLAST_LIMITER": "",
               "BALLAST_FIXED_LIMIT": ""}  # fmt: skip
        uvicorn = [sys.executable, "-m", "uvicorn", "ballast_asgi.gateway:app", "--host", HOST,
                   "--port", str(port), "--log-level", "warning"]  # fmt: skip
        procs.start(uvicorn, None, port, "gateway", env=env)
        base = f"http://{HOST}:{port}"
        load = [sys.executable, "-m", "ballast_tools.loadgen", "--target", base + "/",
                "--rate", str(RATE_RPS), "--duration", f"{seconds + 10:g}s", "--poisson",
                "--quiet"]  # fmt: skip
        procs.start(load, None, None, "load")
        return _watch(name, base, canary, seconds)


def _watch(name: str, base: str, canary: Target, seconds: float) -> dict[str, Any]:
    started = time.monotonic()
    doc: dict[str, Any] = {}
    missed = 0
    while time.monotonic() - started < seconds or not doc:
        time.sleep(1.0)
        try:
            doc = httpx.get(base + "/_ballast/canary", timeout=10).json()
        except httpx.TransportError:
            missed += 1  # a busy machine: the poll is late, the gateway keeps judging
            continue
        if doc["state"] != "running":
            break
    try:  # the last word, however slow the machine made the polls
        doc = httpx.get(base + "/_ballast/canary", timeout=30).json()
    except httpx.TransportError:
        missed += 1
    keep = ("state", "running_s", "counts", "decision", "statistic")
    out: dict[str, Any] = {"scenario": name, "missed_polls": missed, **{k: doc[k] for k in keep}}
    if doc["state"] == "rolled_back":
        time.sleep(1.0)  # in-flight canary requests finish
        before = _served(canary)
        time.sleep(5.0)
        out["canary_served_in_5s_after"] = _served(canary) - before
    return out


def run_all(good_s: float = 600.0, history_ms: int = HISTORY_MS) -> dict[str, Any]:
    """The three scenarios, one after the other."""
    runs = []
    for name, err, mult, seconds in (("+5 pp errors", 0.06, 1.0, 180.0),
                                     ("3x latency", 0.01, 3.0, 180.0),
                                     ("identical", 0.01, 1.0, good_s)):  # fmt: skip
        print(f"live: {name} ...", flush=True)
        runs.append(run_scenario(name, err, mult, seconds, history_ms))
    return {"rate_rps": RATE_RPS, "weight": WEIGHT, "runs": runs, "history_ms": history_ms}


def _history(live: dict[str, Any]) -> str:
    ms = live.get("history_ms")
    return "600000 (the default)" if ms is None else str(ms)


def _learned(statistic: dict[str, Any]) -> str:
    learned = statistic.get("stable_history")
    if not learned:
        return "-"
    errors = learned["errors"]
    z = errors["dispersion_z"]
    return str(errors["regime"]) + ("" if z is None else f", z = {z:.1f}")


def render(live: dict[str, Any]) -> str:
    """The live section of docs/canary.md."""
    rows = [
        "## Live\n",
        f"The gateway (uvicorn) in front of two simulators, {live['rate_rps']} rps open-loop "
        f"(Poisson, `loadgen`), canary weight {live['weight']}, sequential rule, alpha 0.01; "
        "stable fails 1 % of requests. *After*: the canary's age when the judge decided (or "
        "at the last poll). *Served rps*: requests the judge counted per second of that age; "
        f"well under {live['rate_rps']} means the machine (gateway, generator, simulators "
        "sharing two busy cores) was the bottleneck, not the rule. *Stable history*: what the "
        "warm start had learned by then about stable errors (regime, dispersion z); the gateway "
        "starts with the canary, so the history fills during the run "
        f"(`history_ms` {_history(live)}, `min_events` {HISTORY_MIN_EVENTS} here, shortened "
        "from the default 10 minutes so the run shows it; until then the judge is on the "
        "burst bounds).\n",
        "| scenario | outcome | after | served rps | canary requests / errors / slow "
        "| stable requests / errors | log e (errors, latency) | stable history (errors) "
        "| canary requests in the 5 s after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in live["runs"]:
        c, s = r["counts"]["canary"], r["counts"]["stable"]
        st = r["statistic"]
        after = r["decision"]["at_s"] if r["decision"] else r["running_s"]
        reason = f" ({r['decision']['reason']})" if r["decision"] else ""
        rps = (c["requests"] + s["requests"]) / max(after, 1.0)
        rows.append(
            f"| {r['scenario']} | {r['state']}{reason} | {after:.0f} s | {rps:.0f} | "
            f"{c['requests']} / {c['errors']} / {c['slow']} | {s['requests']} / {s['errors']} | "
            f"{st['errors']['log_e_value']:.1f}, {st['latency']['log_e_value']:.1f} | "
            f"{_learned(st)} | {r.get('canary_served_in_5s_after', '-')} |"
        )
    return "\n".join(rows)
