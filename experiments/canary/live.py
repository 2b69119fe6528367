"""The live run: ``uvicorn ballast_asgi.gateway:app`` in front of two simulators, open-loop load.

Three scenarios at 200 rps (Poisson, the default tier mix) with the canary at
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

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

RATE_RPS = 200
WEIGHT = 0.1


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def _process(
    args: list[str], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait(url: str, proc: subprocess.Popen[bytes]) -> None:
    limit = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.TransportError:
            if time.monotonic() > limit:
                raise RuntimeError(f"{url} never answered") from None
            time.sleep(0.1)


def _simulator(stack: ExitStack, error_rate: float, multiplier: float, seed: int) -> dict[str, str]:
    """Start a simulator whose process ``stack`` stops; its traffic and admin URLs."""
    port, admin = _port(), _port()
    args = [sys.executable, "-m", "upstream_sim", "--port", str(port), "--admin-port", str(admin),
            "--workers", "32", "--error-rate", str(error_rate),
            "--latency-multiplier", str(multiplier), "--seed", str(seed)]  # fmt: skip
    proc = stack.enter_context(_process(args))
    _wait(f"http://127.0.0.1:{admin}/health", proc)
    return {"url": f"http://127.0.0.1:{port}", "admin": f"http://127.0.0.1:{admin}"}


def _served(sim: dict[str, str]) -> int:
    return int(httpx.get(sim["admin"] + "/stats", timeout=5).json()["served"])


def run_scenario(
    name: str, canary_error: float, canary_mult: float, seconds: float
) -> dict[str, Any]:
    """One scenario; the polled trace and the outcome."""
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        stable = _simulator(stack, 0.01, 1.0, 1)
        canary = _simulator(stack, canary_error, canary_mult, 2)
        config = Path(tmp) / "ballast.yaml"
        config.write_text(f"upstream: {stable['url']}\nmax_concurrent_requests: 256\n"
                          f"canary:\n  upstream: {canary['url']}\n  weight: {WEIGHT}\n"
                          "  rule: sequential\n  alpha: 0.01\n")  # fmt: skip
        port = _port()
        env = {**os.environ, "BALLAST_CONFIG": str(config), "BALLAST_UPSTREAM": "",
               "BALLAST_LIMITER": "", "BALLAST_FIXED_LIMIT": ""}  # fmt: skip
        gw = stack.enter_context(_process(
            [sys.executable, "-m", "uvicorn", "ballast_asgi.gateway:app", "--port", str(port),
             "--log-level", "warning"], env))  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        _wait(base + "/_ballast/health", gw)
        load = [sys.executable, "-m", "loadgen", "--target", base + "/", "--rate", str(RATE_RPS),
                "--duration", f"{seconds + 10:g}s", "--poisson", "--quiet"]  # fmt: skip
        stack.enter_context(_process(load))
        return _watch(name, base, canary, seconds)


def _watch(name: str, base: str, canary: dict[str, str], seconds: float) -> dict[str, Any]:
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
    keep = ("state", "running_s", "counts", "decision", "statistic")
    out: dict[str, Any] = {"scenario": name, "missed_polls": missed, **{k: doc[k] for k in keep}}
    if doc["state"] == "rolled_back":
        time.sleep(1.0)  # in-flight canary requests finish
        before = _served(canary)
        time.sleep(5.0)
        out["canary_served_in_5s_after"] = _served(canary) - before
    return out


def run_all(good_s: float = 600.0) -> dict[str, Any]:
    """The three scenarios, one after the other."""
    runs = []
    for name, err, mult, seconds in (("+5 pp errors", 0.06, 1.0, 180.0),
                                     ("3x latency", 0.01, 3.0, 180.0),
                                     ("identical", 0.01, 1.0, good_s)):  # fmt: skip
        print(f"live: {name} ...", flush=True)
        runs.append(run_scenario(name, err, mult, seconds))
    return {"rate_rps": RATE_RPS, "weight": WEIGHT, "runs": runs}


def render(live: dict[str, Any]) -> str:
    """The live section of docs/canary.md."""
    rows = [
        "## Live\n",
        f"The gateway (uvicorn) in front of two simulators, {live['rate_rps']} rps open-loop "
        f"(Poisson, `loadgen`), canary weight {live['weight']}, sequential rule, alpha 0.01; "
        "stable fails 1 % of requests. *After*: the canary's age when the judge decided (or "
        "at the last poll). *Served rps*: requests the judge counted per second of that age; "
        f"well under {live['rate_rps']} means the machine (gateway, generator, simulators "
        "sharing two busy cores) was the bottleneck, not the rule.\n",
        "| scenario | outcome | after | served rps | canary requests / errors / slow "
        "| stable requests / errors | log e (errors, latency) | canary requests in the 5 s after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
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
            f"{r.get('canary_served_in_5s_after', '-')} |"
        )
    return "\n".join(rows)
