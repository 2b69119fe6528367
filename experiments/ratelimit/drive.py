"""Open-loop load over two gateways: a schedule of (time, gateway, key) and a driver.

The schedule is fixed before the run (seeded), so the same requests can be
replayed through a perfect bucket afterwards. The driver sends each request
at its intended time whether or not earlier ones returned (the lean client on uvloop),
measures latency from the intended time and records its own lag, so the
report can say when the generator, not the gateways, fell behind.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ballast_tools.loadgen.lean import LeanPool, request_prefix

#: Requests later than this are not sent (counted as not issued).
MAX_LAG_S = 0.25


@dataclass(frozen=True)
class Shape:
    """How the offered load varies: base rate, share to gateway 0, spikes, keys."""

    rate_rps: float
    duration_s: float
    #: Share of requests that go to gateway 0 as a function of time.
    split: Callable[[float], float] = lambda t: 0.5
    #: Multiplier on the rate as a function of time (spikes).
    boost: Callable[[float], float] = lambda t: 1.0
    #: Key for request i (default: one key).
    key: Callable[[random.Random], str] = lambda rng: "t1"


def shifting(swap_s: float = 5.0, heavy: float = 0.9) -> Callable[[float], float]:
    """90 % to one gateway, swapping every ``swap_s``."""
    return lambda t: heavy if int(t // swap_s) % 2 == 0 else 1.0 - heavy


def spikes(
    every_s: float = 2.0, length_s: float = 0.2, factor: float = 6.25
) -> Callable[[float], float]:
    """``factor`` times the base rate for ``length_s`` out of every ``every_s`` (800 -> 5,000)."""
    return lambda t: factor if (t % every_s) < length_s else 1.0


def zipf_keys(n: int, s: float = 1.1) -> Callable[[random.Random], str]:
    """Keys ``k0..k{n-1}`` drawn with Zipf weights."""
    weights = [1.0 / (i + 1) ** s for i in range(n)]
    total = 0.0
    cumulative = []
    for w in weights:
        total += w
        cumulative.append(total)

    def pick(rng: random.Random) -> str:
        return f"k{bisect.bisect_left(cumulative, rng.random() * total)}"

    return pick


def build(shape: Shape, seed: int) -> list[tuple[float, int, str]]:
    """Arrivals ``(offset_s, gateway, key)`` on an even grid whose spacing follows the rate."""
    rng = random.Random(seed)
    out: list[tuple[float, int, str]] = []
    t = 0.0
    while t < shape.duration_s:
        gw = 0 if rng.random() < shape.split(t) else 1
        out.append((t, gw, shape.key(rng)))
        t += 1.0 / (shape.rate_rps * shape.boost(t))
    return out


@dataclass
class Result:
    """One request: intended offset, gateway, key, status (0 = error, -1 = not issued), latency."""

    offset_s: float
    gateway: int
    key: str
    status: int
    latency_s: float
    lag_s: float
    #: X-Ballast-Reason of a shed response ("" otherwise).
    reason: str = ""


async def run(
    targets: Sequence[str], schedule: list[tuple[float, int, str]], prefix: str,
    header: str = "x-tenant", timeout_s: float = 2.0, seq: bool = False,
) -> tuple[list[Result], float]:  # fmt: skip
    """Send the schedule; return the results and the generator's CPU seconds.

    Requests go out on the lean client (HTTP/1.1 on asyncio protocols, keep-alive
    pools, no task per request; ``ballast_tools.loadgen.lean``), which costs a
    fraction of aiohttp's CPU: with aiohttp the generator took a whole core at
    1,500 rps on this two-core machine, beside two gateways, the upstream and Redis.
    ``seq`` adds ``x-seq: <index in the schedule>`` (``traced.py`` keys its records by it).
    """
    results: list[Result] = []
    loop = asyncio.get_running_loop()
    #: slot -> (due on perf_counter, offset, gateway, key, lag) of requests in flight.
    flight: dict[int, tuple[float, float, int, str, float]] = {}
    drained = loop.create_future()
    sending = True

    def done(slot: int, status: int, reason: str | None, detail: str) -> None:
        due, offset, gw, key, lag = flight.pop(slot)
        latency = time.perf_counter() - due
        results.append(Result(offset, gw, key, status, latency, lag, reason or ""))
        if not sending and not flight and not drained.done():
            drained.set_result(None)

    pools: list[LeanPool] = []
    heads: list[bytes] = []
    for target in targets:
        host, port, head = request_prefix(target + "/r", "GET")
        pools.append(LeanPool(host, port, done))
        heads.append(head)
    cpu0 = time.process_time()
    # Sleep on the loop's clock, measure on perf_counter: uvloop's loop.time() moves in
    # whole milliseconds, too coarse for a 0.1 ms added-latency target.
    t0 = loop.time() + 0.05
    p0 = time.perf_counter() + 0.05
    for slot, (offset, gw, key) in enumerate(schedule):
        delay = t0 + offset - loop.time()
        if delay > 0.0005:
            await asyncio.sleep(delay)
        due = p0 + offset
        lag = max(0.0, time.perf_counter() - due)
        if lag > MAX_LAG_S:
            results.append(Result(offset, gw, key, -1, math.nan, lag))
            continue
        flight[slot] = (due, offset, gw, key, lag)
        extra = f"x-seq: {slot}\r\n" if seq else ""
        data = heads[gw] + f"{header}: {prefix}{key}\r\n{extra}\r\n".encode()
        pools[gw].send(slot, data, timeout_s)
    sending = False
    if flight:
        await drained
    for pool in pools:
        await pool.close()
    return results, time.process_time() - cpu0
