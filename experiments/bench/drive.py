"""Load for ``make bench``: open-loop runs (loadgen) and a cheap closed-loop blaster.

``open_loop`` runs ``loadgen.runner`` in this process on a fresh uvloop loop
(one tier, constant arrivals) and measures the target process's CPU over the
run from ``/proc/<pid>/stat``: CPU us per request = (utime+stime delta) / sent.

``blast`` is a closed loop of ``conns`` raw asyncio connections, each keeping
one request outstanding (no pipelining): a response is counted when its status
line arrives and the next request is written at once. Parsing is a byte count
of the status line marker, so the client costs a few microseconds per request
and the target, not the generator, is the bottleneck (used for sheds/s).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass
from typing import Any, cast

import uvloop

from ballast_tools.loadgen.report import summarize
from ballast_tools.loadgen.runner import LoadConfig, LoadRunner
from ballast_tools.loadgen.schedule import make_tiers
from experiments._harness.cpu import busy_share, cpu_s, cpu_ticks
from experiments._harness.loop import HiResLoop
from experiments._harness.procs import HOST
from experiments._harness.servers import Target


@dataclass
class OpenRun:
    """One open-loop run against one target at one rate."""

    config: str
    rate: float
    rep: int
    seconds: float
    scheduled: int
    sent: int
    served: int
    failed: int
    p50_ms: float
    p99_ms: float
    served_rps: float
    cpu_us: float
    gen_lag_p99_ms: float
    gen_cpu_us: float
    #: Share of the wall time the proxy process ran, and that CPU 0 / CPU 1 were busy (anyone).
    proxy_util: float = math.nan
    cpu0_busy: float = math.nan
    cpu1_busy: float = math.nan

    @property
    def held(self) -> bool:
        """p99 < 50 ms, failures < 0.1 %, throughput >= 95 % of offered."""
        ok_fail = self.failed <= 0.001 * self.scheduled
        return self.p99_ms < 50.0 and ok_fail and self.served_rps >= 0.95 * self.rate

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, with the verdict."""
        return {**asdict(self), "held": self.held}


def settle(pid: int | None, quiet_share: float = 0.05, max_s: float = 8.0) -> float:
    """Wait (bounded) until ``pid`` uses < ``quiet_share`` of a core; returns seconds waited.

    A proxy that collapsed keeps working through its backlog after the
    generator gave up; without this, it would steal CPU 1 from the next run.
    """
    if pid is None:
        return 0.0
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_s:
        before = cpu_s(pid)
        time.sleep(0.2)
        if cpu_s(pid) - before < quiet_share * 0.2:
            break
    return time.monotonic() - t0


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


def open_loop(
    target: Target, rate: float, seconds: float, rep: int, deadline_s: float = 1.0
) -> OpenRun:
    """Offer ``rate`` rps for ``seconds`` (one tier, deadline ``deadline_s``)."""
    cfg = LoadConfig(
        target=target.url,
        rate_rps=rate,
        duration_s=seconds,
        tiers=make_tiers((0.0, 1.0, 0.0), (deadline_s, deadline_s, deadline_s)),
        max_lag_s=0.5,
    )
    runner = LoadRunner(cfg)
    before = cpu_s(target.pid) if target.pid else 0.0
    ticks = cpu_ticks()
    with asyncio.Runner(loop_factory=HiResLoop) as loop:
        result = loop.run(runner.run())
    used = (cpu_s(target.pid) - before) if target.pid else math.nan
    busy0, busy1 = busy_share(ticks, 0), busy_share(ticks, 1)
    settle(target.pid)
    s = summarize(result)
    t = s["tiers"]["standard"]
    g = s["generator"]
    sent = int(g["sent"])
    return OpenRun(
        config=target.name,
        rate=rate,
        rep=rep,
        seconds=seconds,
        scheduled=int(g["scheduled"]),
        sent=sent,
        served=int(t["served"]),
        failed=int(g["scheduled"]) - int(t["served"]),
        p50_ms=_nan(t["latency_all_ms"]["p50"]),
        p99_ms=_nan(t["latency_all_ms"]["p99"]),
        served_rps=t["served"] / seconds,
        cpu_us=used / sent * 1e6 if sent else math.nan,
        gen_lag_p99_ms=_nan(g["schedule_lag_ms"]["p99"]),
        gen_cpu_us=_nan(g["cpu_us_per_request"]),
        proxy_util=used / result.wall_s,
        cpu0_busy=busy0,
        cpu1_busy=busy1,
    )


# -- the closed-loop blaster --------------------------------------------------

_MARK = b"HTTP/1.1 "


class _Conn(asyncio.Protocol):
    def __init__(self, request: bytes, counts: dict[str, int], stop: list[bool]) -> None:
        self.request = request
        self.counts = counts
        self.stop = stop
        self.tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        buf = self.tail + data
        n = buf.count(_MARK)
        self.tail = buf[-(len(_MARK) - 1) :]
        if not n:
            return
        self.counts["responses"] += n
        self.counts["status_2xx"] += buf.count(b"HTTP/1.1 2")
        if not self.stop[0] and self.transport is not None:
            self.transport.write(self.request * n)

    def connection_lost(self, exc: Exception | None) -> None:
        self.counts["lost"] += 1


async def _blast(port: int, request: bytes, conns: int, seconds: float) -> dict[str, int]:
    loop = asyncio.get_running_loop()
    counts = {"responses": 0, "status_2xx": 0, "lost": 0}
    stop = [False]
    made = [
        await loop.create_connection(lambda: _Conn(request, counts, stop), HOST, port)
        for _ in range(conns)
    ]
    await asyncio.sleep(seconds)
    stop[0] = True
    for transport, _ in made:
        transport.close()
    return counts


@dataclass
class BlastRun:
    """One closed-loop run: responses/s and the target's CPU per response."""

    mode: str
    rep: int
    seconds: float
    responses: int
    status_2xx: int
    rps: float
    cpu_us: float
    cpu_util: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe."""
        return asdict(self)


def request_bytes(path: str, headers: dict[str, str]) -> bytes:
    """One HTTP/1.1 GET with keep-alive."""
    lines = [f"GET {path} HTTP/1.1", f"Host: {HOST}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def blast(
    target: Target, mode: str, request: bytes, conns: int, seconds: float, rep: int
) -> BlastRun:
    """Closed loop of ``conns`` connections for ``seconds``; CPU of the target over it."""
    assert target.pid is not None
    before, t0 = cpu_s(target.pid), time.monotonic()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as loop:
        counts = loop.run(_blast(target.port, request, conns, seconds))
    wall = time.monotonic() - t0
    used = cpu_s(target.pid) - before
    n = counts["responses"]
    return BlastRun(
        mode=mode,
        rep=rep,
        seconds=seconds,
        responses=n,
        status_2xx=counts["status_2xx"],
        rps=n / seconds,
        cpu_us=used / n * 1e6 if n else math.nan,
        cpu_util=used / wall,
    )
