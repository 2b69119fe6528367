"""Headroom (issue 31): what a shed and a proxied request cost next to nginx and uvicorn's floor.

    python -m experiments.bench.headroom [--seconds 5] [--reps 3] [--conns 16] [--docs]
    make bench-headroom

Six servers, each pinned to CPU 1 and loaded in turn by ``wrk -t1 -c16`` pinned
to CPU 0 (next to the nginx backend serving 1 KB), closed loop:

1. nginx as a reverse proxy (keep-alive pool to the backend);
2. nginx ``return 429`` (the gateway's shed body and headers, as a constant);
3. uvicorn + a bare ASGI app answering a constant 429 (``floor_app``: the same
   bytes as the gateway's shed; uvicorn with uvloop and httptools, no access log,
   no date/server header: the Python server's own floor);
4. the bare aiohttp pass-through under uvicorn (``experiments.bench.bare``);
5. ``uvicorn ballast_asgi.gateway:app`` with every default, proxied;
6. the same gateway shedding: every request carries ``X-Deadline-Ms: 0``;

plus, below the table, the same gateway with ``server.shed_at_wire: false``
shedding (the ASGI path's shed, for the before/after), and where the proxied
cost sits: the two Python floors of ``floors.py`` (a raw callback proxy, uvicorn
+ a raw ASGI proxy) and the gateway with ``retry.enabled: false``. Runs alternate (the order
rotates each repetition); per run the server's CPU seconds are read from
``/proc/<pid>/stat`` (utime + stime of every thread) before and after, and
divided by the responses wrk counted. Medians of ``--reps``; peak RSS
(``VmHWM``) per server at the end. About 3 minutes with the defaults.
``--docs`` replaces the marked headroom block in docs/bench.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments._harness.cpu import cpu_s, pin_self, status_kb
from experiments._harness.machine import machine, versions
from experiments._harness.procs import HOST, Procs, free_port, processes, stop_on_signals
from experiments._harness.servers import (
    NGINX_HEAD,
    Target,
    ensure_package,
    find_binary,
    start_backend,
    start_bare,
    start_nginx_proxy,
    start_on_free_ports,
    start_uvicorn_gateway,
)
from experiments._harness.stats import spread

CPU_LOAD, CPU_PROXY = 0, 1
#: The gateway's shed of a dead-on-arrival standard request (Retry-After 1).
SHED_BODY = b'{"error":"shed","reason":"deadline","priority":"standard","retry_after_s":1}'
SHED_HEADERS = [
    (b"content-type", b"application/json"),
    (b"cache-control", b"no-store"),
    (b"content-length", str(len(SHED_BODY)).encode()),
    (b"retry-after", b"1"),
    (b"x-ballast-reason", b"deadline"),
]
NGINX_429 = NGINX_HEAD + """
  server {{ listen {host}:{port} backlog=4096;
    location / {{ default_type application/json;
      add_header Cache-Control no-store always; add_header Retry-After 1 always;
      add_header X-Ballast-Reason deadline always;
      return 429 '{body}'; }} }} }}
"""  # fmt: skip
DOOMED = ("X-Deadline-Ms", "0")
_START = {"type": "http.response.start", "status": 429, "headers": SHED_HEADERS}
_BODY = {"type": "http.response.body", "body": SHED_BODY}
#: Row key, label (exactly the issue's rows, in its order).
ROWS = [
    ("nginx", "nginx as reverse proxy"),
    ("nginx-429", "nginx `return 429`"),
    ("floor", "uvicorn + a bare ASGI app answering a constant 429 (the floor)"),
    ("aiohttp", "bare aiohttp pass-through under uvicorn"),
    ("proxied", "`uvicorn ballast_asgi.gateway:app`, proxied (defaults)"),
    ("shed", "the gateway shedding a request whose deadline is spent"),
]
WIRE_OFF = "shed-wire-off"
#: The same wire-off gateway, proxied: what deciding at the wire costs a request it passes on.
PROXIED_WIRE_OFF = "proxied-wire-off"
#: The gateway with ``server.lane: false``, proxied: every request through the ASGI task.
LANE_OFF = "proxied-lane-off"
#: The same floor app under ``uvicorn`` with its defaults (access log, date and server headers).
FLOOR_DEFAULTS = "floor-defaults"
#: ``--before``: the same two gateway rows from another checkout (e.g. main), same run.
BEFORE = ("proxied-before", "shed-before")
#: Where the proxied cost sits (``floors.py``): the raw callback proxy (Python's floor), uvicorn
#: + a raw ASGI proxy (the ASGI floor), the gateway with ``retry.enabled: false``.
FLOORS = ("raw-proxy", "asgi-proxy", "proxied-no-retry")
_TOTAL = re.compile(rb"(\d+) requests in")
_NON2XX = re.compile(rb"Non-2xx or 3xx responses:\s+(\d+)")
_ERRORS = re.compile(rb"Socket errors:.*")


async def floor_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A constant 429 with the gateway's shed bytes (uvicorn's own floor)."""
    if scope["type"] == "http":
        await send(_START)
        await send(_BODY)
    elif scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return


def start_nginx_429(procs: Procs, cpu: int) -> Target:
    """nginx answering every request with the shed body and a 429."""
    nginx = find_binary("nginx")
    assert nginx is not None
    port = free_port()
    conf = procs.tmp / f"r429-{port}.conf"
    body = SHED_BODY.decode()
    conf.write_text(NGINX_429.format(dir=procs.tmp, host=HOST, port=port, body=body))
    proc = procs.start([nginx, "-c", str(conf), "-p", str(procs.tmp)], cpu, port, "nginx-429")
    return Target("nginx-429", port, proc.pid)


def start_floor(procs: Procs, cpu: int, defaults: bool = False) -> Target:
    """uvicorn (uvloop, httptools) serving ``floor_app``: no access log, no date or server
    header (the gateway form's settings); ``defaults``: uvicorn's own defaults."""
    uvicorn = os.path.join(os.path.dirname(sys.executable), "uvicorn")
    lean = [] if defaults else ["--no-access-log", "--no-server-header", "--no-date-header"]
    name = FLOOR_DEFAULTS if defaults else "floor"

    def cmd(port: int, _admin: int) -> list[str]:
        return [uvicorn, "experiments.bench.headroom:floor_app", "--host", HOST, "--port",
                str(port), *lean]  # fmt: skip

    proc, port, _ = start_on_free_ports(procs, cmd, cpu, name)
    return Target(name, port, proc.pid)


def start_before(procs: Procs, uvicorn: str, upstream: str) -> Target:
    """``uvicorn ballast_asgi.gateway:app`` from another installation (its own ``uvicorn``;
    ``--app-dir`` its checkout: uvicorn puts the app directory, by default the current
    one, this checkout, first on ``sys.path``)."""
    root = _root(uvicorn)

    def cmd(port: int, _admin: int) -> list[str]:
        return [uvicorn, "ballast_asgi.gateway:app", "--app-dir", root, "--host", HOST,
                "--port", str(port)]  # fmt: skip

    env = {"BALLAST_UPSTREAM": upstream}
    proc, port, _ = start_on_free_ports(procs, cmd, CPU_PROXY, "gateway-before", env)
    return Target("gateway-before", port, proc.pid)


def start_all(procs: Procs, before: str | None = None) -> tuple[dict[str, Target], str]:
    """Every server of the table (and the wire-off gateway); the backend note."""
    backend, note = start_backend(procs, CPU_LOAD)
    gw = start_uvicorn_gateway(procs, "gateway", backend.base, CPU_PROXY)
    off = procs.tmp / "wire-off.yaml"
    off.write_text("server:\n  shed_at_wire: false\n")
    gw_off = start_uvicorn_gateway(
        procs, "gateway-wire-off", backend.base, CPU_PROXY, {"BALLAST_CONFIG": str(off)}
    )
    no_lane = procs.tmp / "lane-off.yaml"
    no_lane.write_text("server:\n  lane: false\n")
    gw_no_lane = start_uvicorn_gateway(
        procs, "gateway-lane-off", backend.base, CPU_PROXY, {"BALLAST_CONFIG": str(no_lane)}
    )
    targets = {
        "nginx": start_nginx_proxy(procs, backend.port, CPU_PROXY),
        "nginx-429": start_nginx_429(procs, CPU_PROXY),
        "floor": start_floor(procs, CPU_PROXY),
        "aiohttp": start_bare(procs, "aiohttp", backend.port, CPU_PROXY),
        "proxied": gw,
        "shed": gw,
        WIRE_OFF: gw_off,
        PROXIED_WIRE_OFF: gw_off,
        LANE_OFF: gw_no_lane,
        FLOOR_DEFAULTS: start_floor(procs, CPU_PROXY, defaults=True),
    }
    targets.update(start_floors(procs, backend))
    if before:
        old = start_before(procs, before, backend.base)
        targets[BEFORE[0]] = targets[BEFORE[1]] = old
    return targets, note


def start_floors(procs: Procs, backend: Target) -> dict[str, Target]:
    """The ``FLOORS`` rows, each pinned to the proxy CPU."""
    uvicorn = os.path.join(os.path.dirname(sys.executable), "uvicorn")

    def raw(port: int, _admin: int) -> list[str]:
        return [sys.executable, "-m", "experiments.bench.floors", "raw", "--upstream-port",
                str(backend.port), "--port", str(port)]  # fmt: skip

    def asgi(port: int, _admin: int) -> list[str]:
        return [uvicorn, "experiments.bench.floors:asgi_app", "--host", HOST, "--port", str(port),
                "--no-access-log", "--no-server-header", "--no-date-header"]  # fmt: skip

    raw_proc, raw_port, _ = start_on_free_ports(procs, raw, CPU_PROXY, FLOORS[0])
    env = {"UPSTREAM_PORT": str(backend.port)}
    asgi_proc, asgi_port, _ = start_on_free_ports(procs, asgi, CPU_PROXY, FLOORS[1], env)
    no_retry = procs.tmp / "no-retry.yaml"
    no_retry.write_text("retry:\n  enabled: false\n")
    config = {"BALLAST_CONFIG": str(no_retry)}
    return {
        FLOORS[0]: Target(FLOORS[0], raw_port, raw_proc.pid),
        FLOORS[1]: Target(FLOORS[1], asgi_port, asgi_proc.pid),
        FLOORS[2]: start_uvicorn_gateway(procs, FLOORS[2], backend.base, CPU_PROXY, config),
    }


def wrk_run(wrk: str, target: Target, conns: int, seconds: float, doomed: bool) -> dict[str, Any]:
    """One closed-loop run: responses counted by wrk, the server's CPU from /proc."""
    assert target.pid is not None
    header = ["-H", f"{DOOMED[0]}: {DOOMED[1]}"] if doomed else []
    cmd = ["taskset", "-c", str(CPU_LOAD), wrk, "-t1", f"-c{conns}", f"-d{seconds:g}s",
           *header, target.url]  # fmt: skip
    before, t0 = cpu_s(target.pid), time.monotonic()
    out = subprocess.run(cmd, capture_output=True, check=True, timeout=seconds + 30).stdout
    wall, used = time.monotonic() - t0, cpu_s(target.pid) - before
    total = _TOTAL.search(out)
    n = int(total.group(1)) if total else 0
    non2xx = _NON2XX.search(out)
    errors = _ERRORS.search(out)
    return {
        "responses": n,
        "rps": n / seconds,
        "cpu_us": used / n * 1e6 if n else float("nan"),
        "cpu_util": used / wall,
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "socket_errors": errors.group(0).decode() if errors else "",
    }


def measure(
    targets: dict[str, Target], wrk: str, conns: int, seconds: float, reps: int,
    only: list[str] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every row (``only``: these) ``reps`` times, alternating, the order rotated each time."""
    extra = (WIRE_OFF, PROXIED_WIRE_OFF, LANE_OFF, FLOOR_DEFAULTS, *FLOORS, *BEFORE)
    keys = [k for k, _ in ROWS] + [k for k in extra if k in targets]
    keys = [k for k in keys if only is None or k in only]
    for key in keys:  # warm-up: connections, imports, first-request paths
        wrk_run(wrk, targets[key], conns, 1.0, key.startswith("shed"))
    runs = []
    for rep in range(reps):
        order = keys[rep % len(keys) :] + keys[: rep % len(keys)]
        for key in order:
            result = wrk_run(wrk, targets[key], conns, seconds, key.startswith("shed"))
            run = {"row": key, "rep": rep, **result}
            runs.append(run)
            print(f"  headroom {key:14s} rep {rep}: {run['rps']:9,.0f} rps, "
                  f"{run['cpu_us']:6.1f} us/resp, CPU {100 * run['cpu_util']:.0f} %, "
                  f"non-2xx {run['non_2xx']}", flush=True)  # fmt: skip
    return runs


def summarize(runs: list[dict[str, Any]], rss: dict[str, float]) -> dict[str, Any]:
    """Medians (with ranges) per row, the ratios of the medians and the target verdicts."""
    rows: dict[str, Any] = {}
    for key in [k for k, _ in ROWS] + [WIRE_OFF, PROXIED_WIRE_OFF, LANE_OFF, FLOOR_DEFAULTS,
                                       *FLOORS, *BEFORE]:  # fmt: skip
        mine = [r for r in runs if r["row"] == key]
        if not mine:
            continue
        rows[key] = {
            "cpu_us": spread([r["cpu_us"] for r in mine]),
            "rps": spread([r["rps"] for r in mine]),
            "cpu_util": spread([r["cpu_util"] for r in mine]),
            "rss_mb": rss.get(key, float("nan")),
        }

    def cpu(key: str) -> float:
        return float(rows[key]["cpu_us"][0])

    def rps(key: str) -> float:
        return float(rows[key]["rps"][0])

    ratios = {
        "shed_vs_floor": cpu("shed") / cpu("floor"),
        "shed_wire_off_vs_floor": cpu(WIRE_OFF) / cpu("floor"),
        "proxied_vs_nginx": cpu("proxied") / cpu("nginx"),
        "proxied_rate_vs_aiohttp": rps("proxied") / rps("aiohttp"),
        "floor_vs_nginx_429": cpu("floor") / cpu("nginx-429"),
    }
    if FLOOR_DEFAULTS in rows:
        ratios["shed_vs_floor_defaults"] = cpu("shed") / cpu(FLOOR_DEFAULTS)
    if PROXIED_WIRE_OFF in rows:
        ratios["proxied_vs_wire_off"] = cpu("proxied") / cpu(PROXIED_WIRE_OFF)
    if LANE_OFF in rows:
        ratios["proxied_vs_lane_off"] = cpu("proxied") / cpu(LANE_OFF)
    if all(k in rows for k in FLOORS):
        ratios["raw_proxy_vs_nginx"] = cpu(FLOORS[0]) / cpu("nginx")
        ratios["asgi_proxy_vs_nginx"] = cpu(FLOORS[1]) / cpu("nginx")
        ratios["proxied_no_retry_vs_nginx"] = cpu(FLOORS[2]) / cpu("nginx")
    if BEFORE[0] in rows:
        ratios["before_proxied_vs_nginx"] = cpu(BEFORE[0]) / cpu("nginx")
        ratios["before_shed_vs_floor"] = cpu(BEFORE[1]) / cpu("floor")
        ratios["before_proxied_rate_vs_aiohttp"] = rps(BEFORE[0]) / rps("aiohttp")
    targets = [
        ("CPU per shed <= 1.0x the floor", ratios["shed_vs_floor"] <= 1.0,
         f"{ratios['shed_vs_floor']:.2f}x"),
        ("step: CPU per shed <= 1.3x the floor", ratios["shed_vs_floor"] <= 1.3,
         f"{ratios['shed_vs_floor']:.2f}x"),
        (">= 15,000 sheds/s on one core", *_shed_rate(rows["shed"])),
        ("CPU per proxied request <= 4x nginx", ratios["proxied_vs_nginx"] <= 4.0,
         f"{ratios['proxied_vs_nginx']:.2f}x"),
        ("step: CPU per proxied request <= 6x nginx", ratios["proxied_vs_nginx"] <= 6.0,
         f"{ratios['proxied_vs_nginx']:.2f}x"),
        ("held rate >= 1.3x bare aiohttp", ratios["proxied_rate_vs_aiohttp"] >= 1.3,
         f"{ratios['proxied_rate_vs_aiohttp']:.2f}x"),
    ]  # fmt: skip
    verdicts = [{"target": t, "met": ok, "measured": m} for t, ok, m in targets]
    return {"rows": rows, "ratios": ratios, "targets": verdicts}


#: Below this CPU share the server was waiting for the client (wrk on the shared CPU 0).
CLIENT_BOUND = 0.9


def _shed_rate(row: dict[str, Any]) -> tuple[bool, str]:
    """The sheds/s verdict: on the measured rate when the server's core was busy; when the
    client held it back (CPU busy < ``CLIENT_BOUND``), on its core's capacity (1 s / CPU
    per shed), said so in the measured text."""
    rate, util, cpu_us = row["rps"][0], row["cpu_util"][0], row["cpu_us"][0]
    if util >= CLIENT_BOUND:
        return rate >= 15_000, f"{rate:,.0f}/s"
    capacity = 1e6 / cpu_us
    return capacity >= 15_000, (
        f"{capacity:,.0f}/s by capacity (1 s / CPU per shed); client-bound: {rate:,.0f}/s "
        f"measured with the server's CPU {100 * util:.0f} % busy"
    )


def table(doc: dict[str, Any]) -> list[str]:
    """Markdown lines: the table, the ratios, the verdicts."""
    s = doc["summary"]
    rows, ratios = s["rows"], s["ratios"]
    floor, nginx = rows["floor"]["cpu_us"][0], rows["nginx"]["cpu_us"][0]

    def cell(v: list[float], digits: int = 0) -> str:
        return f"{v[0]:,.{digits}f} ({v[1]:,.{digits}f}-{v[2]:,.{digits}f})"

    def versus(key: str) -> str:
        us = rows[key]["cpu_us"][0]
        if key == "shed":
            return f" ({us / floor:.2f}x the floor)"
        if key == "proxied":
            return f" ({us / nginx:.2f}x nginx)"
        return ""

    out = [
        f"Measured {doc['date']} on {doc['commit']}: {doc['client']}, {doc['seconds']:g} s per "
        f"run, medians of {doc['reps']} (range), rows alternating; {doc['backend']}. CPU per "
        "response = the server process's utime + stime (`/proc/<pid>/stat`, all threads) "
        "over the run / responses wrk counted. Load average at start "
        f"{doc['loadavg'][0]}, at the end {doc['loadavg'][1]}. The gateway ran "
        f"{doc.get('native', 'the sources')}.",
        "",
        "| what | CPU per response (us) | responses/s on one core | its CPU busy | "
        "1 s / CPU per response | peak RSS (MB) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for key, label in ROWS:
        r = rows[key]
        out.append(f"| {label} | {cell(r['cpu_us'], 1)}{versus(key)} | {cell(r['rps'])} | "
                   f"{100 * r['cpu_util'][0]:.0f} % | {1e6 / r['cpu_us'][0]:,.0f}/s | "
                   f"{r['rss_mb']:.0f} |")  # fmt: skip
    off = rows[WIRE_OFF]
    out += [
        "",
        f"Same run, the gateway shedding with `server.shed_at_wire: false` (the ASGI path's "
        f"shed): {cell(off['cpu_us'], 1)} us per shed ({ratios['shed_wire_off_vs_floor']:.2f}x "
        f"the floor), {cell(off['rps'])} sheds/s. uvicorn's floor is "
        f"{ratios['floor_vs_nginx_429']:.1f}x nginx `return 429`. A server whose CPU was not "
        "busy all the time was held back by the client (wrk shares CPU 0 with the backend): "
        "its responses/s is a lower bound, `1 s / CPU per response` what its core would do.",
    ]
    if PROXIED_WIRE_OFF in rows:
        p = rows[PROXIED_WIRE_OFF]
        out += [
            "",
            f"The same wire-off gateway proxying: {cell(p['cpu_us'], 1)} us per request "
            f"(proxied with the wire on / off: {ratios['proxied_vs_wire_off']:.2f}x).",
        ]
    if LANE_OFF in rows:
        q = rows[LANE_OFF]
        out += [
            "",
            f"The gateway with `server.lane: false` proxying (every request an ASGI task): "
            f"{cell(q['cpu_us'], 1)} us per request, {cell(q['rps'])}/s (proxied with the lane "
            f"on / off: {ratios['proxied_vs_lane_off']:.2f}x).",
        ]
    if FLOOR_DEFAULTS in rows:
        d = rows[FLOOR_DEFAULTS]
        out += [
            "",
            f"The floor app under plain `uvicorn` (its defaults: access log to stdout, date "
            f"and server headers): {cell(d['cpu_us'], 1)} us per response; the gateway's shed "
            f"is {ratios['shed_vs_floor_defaults']:.2f}x that. The table's floor is the "
            "stricter one (the gateway form's settings).",
        ]
    if all(k in rows for k in FLOORS):
        out += ["", *floors_text(rows, ratios)]
    if BEFORE[0] in rows:
        old_p, old_s = rows[BEFORE[0]], rows[BEFORE[1]]
        out += [
            "",
            f"Before (same run, `{doc.get('before', '?')}`): proxied {cell(old_p['cpu_us'], 1)} "
            f"us ({ratios['before_proxied_vs_nginx']:.2f}x nginx), {cell(old_p['rps'])}/s "
            f"({ratios['before_proxied_rate_vs_aiohttp']:.2f}x bare aiohttp); shedding "
            f"{cell(old_s['cpu_us'], 1)} us ({ratios['before_shed_vs_floor']:.2f}x the floor), "
            f"{cell(old_s['rps'])}/s.",
        ]
    out += [
        "",
        "| target | measured | met |",
        "| --- | --- | --- |",
    ]
    for t in s["targets"]:
        out.append(f"| {t['target']} | {t['measured']} | {'met' if t['met'] else 'missed'} |")
    return out


def floors_text(rows: dict[str, Any], ratios: dict[str, float]) -> list[str]:
    """Where the proxied microseconds sit, from the ``FLOORS`` rows of the same run."""
    raw, asgi, no_retry = (rows[k]["cpu_us"][0] for k in FLOORS)
    proxied = rows["proxied"]["cpu_us"][0]
    return [
        f"Where the proxied cost sits (same run, `experiments/bench/floors.py`): a raw callback "
        f"proxy in Python (uvloop + httptools both sides, no ASGI, no task per request) "
        f"{raw:.1f} us ({ratios['raw_proxy_vs_nginx']:.2f}x nginx); uvicorn + a raw ASGI proxy "
        f"app (one coroutine per request, no stages) {asgi:.1f} us "
        f"({ratios['asgi_proxy_vs_nginx']:.2f}x); the gateway with `retry.enabled: false` "
        f"{no_retry:.1f} us ({ratios['proxied_no_retry_vs_nginx']:.2f}x). So uvicorn's request "
        f"cycle and the coroutine cost {asgi - raw:.1f} us, the gateway's own code above the "
        f"ASGI floor {proxied - asgi:.1f} us, of which the retry stage {proxied - no_retry:.1f}.",
    ]


BEGIN, END = "<!-- headroom:begin -->", "<!-- headroom:end -->"


def update_docs(doc: dict[str, Any], path: Path) -> None:
    """Replace the marked headroom block in ``path`` (appended when missing)."""
    block = "\n".join([BEGIN, *table(doc), END])
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Headroom (issue 31)\n\n" + block + "\n"
    path.write_text(text)


def headroom(
    procs: Procs, seconds: float, reps: int, conns: int, before: str | None = None,
    only: list[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Start the servers, run the alternating measurements, summarize."""
    wrk = ensure_package("wrk", "wrk")
    if wrk is None or find_binary("nginx") is None:
        return {"skipped": "wrk or nginx not installed (make system-deps)"}
    load0 = [round(x, 2) for x in os.getloadavg()]
    targets, note = start_all(procs, before)
    runs = measure(targets, wrk, conns, seconds, reps, only)
    if only is not None:  # a partial run: the raw runs only (no table)
        return {"runs": runs, "only": only}
    rss = {k: status_kb(t.pid, "VmHWM") / 1024 for k, t in targets.items() if t.pid}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()  # fmt: skip
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit or "?",
        "client": f"wrk -t1 -c{conns} on CPU 0",
        "backend": note,
        "seconds": seconds,
        "reps": reps,
        "loadavg": [load0, [round(x, 2) for x in os.getloadavg()]],
        "runs": runs,
        "summary": summarize(runs, rss),
        "before": _describe(before),
        "native": _native(),
    }


def _native() -> str:
    """What the gateway rows ran: the compiled cores (ADR 0021) or the sources, and why.

    The gateways are started from this checkout with this environment, so this
    process's own import decided the same (``native.status``)."""
    from ballast_asgi.core import native

    state = native.status()
    if state["compiled"]:
        return f"the compiled cores ({state['modules']} modules, ADR 0021)"
    return f"the sources ({state['why_not']})"


def _root(uvicorn: str) -> str:
    """The checkout ``ballast_asgi`` is imported from by the installation of ``uvicorn``
    (asked from ``/``, so that no current directory comes first on its path)."""
    code = "import ballast_asgi, os; print(os.path.dirname(os.path.dirname(ballast_asgi.__file__)))"
    python = os.path.join(os.path.dirname(uvicorn), "python")
    where = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                           cwd="/")  # fmt: skip
    return where.stdout.strip()


def _describe(uvicorn: str | None) -> str | None:
    """``<checkout> at <commit>`` of the installation whose ``uvicorn`` is given."""
    if uvicorn is None:
        return None
    root = _root(uvicorn)
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    return f"{root} at {commit or '?'}"


def main(argv: list[str] | None = None) -> int:
    """Run the headroom table alone; print it, save the raw data, optionally update the docs."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench.headroom", description=__doc__)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--conns", type=int, default=16)
    p.add_argument("--docs", action="store_true", help="update the block in docs/bench.md")
    p.add_argument("--out", type=Path, help="raw results (runs/headroom-<time>.json)")
    p.add_argument("--before", help="also run the gateway rows from this uvicorn (another venv)")
    p.add_argument("--only", help="comma-separated rows to run (no table): e.g. floor,shed")
    a = p.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        print("headroom: needs 2 CPUs (server on CPU 1, wrk on CPU 0)", file=sys.stderr)
        return 2
    pin_self(CPU_LOAD)
    stop_on_signals()
    with (
        tempfile.TemporaryDirectory(prefix="ballast-headroom-") as tmp,
        processes(Path(tmp)) as procs,
    ):
        only = a.only.split(",") if a.only else None
        doc = headroom(procs, a.seconds, a.reps, a.conns, a.before, only)
    if "skipped" in doc:
        print(f"headroom: skipped: {doc['skipped']}", file=sys.stderr)
        return 2
    if "only" in doc:
        for key in doc["only"]:
            mine = [r for r in doc["runs"] if r["row"] == key]
            cpu, rps = spread([r["cpu_us"] for r in mine]), spread([r["rps"] for r in mine])
            print(f"{key:16s} CPU us/resp median {cpu[0]:.1f} ({cpu[1]:.1f}-{cpu[2]:.1f}), "
                  f"{rps[0]:,.0f} resp/s")  # fmt: skip
        return 0
    doc["machine"] = {**machine(), "versions": versions()}
    out = a.out or Path("runs") / time.strftime("headroom-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    print("\n".join(table(doc)))
    if a.docs:
        update_docs(doc, Path("docs") / "bench.md")
    print(f"\nheadroom: raw data {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
