"""CPU per ``EVALSHA`` through the Redis clients we could use (the measured choice).

``python -m experiments.ratelimit.clientbench [--calls N] [--rounds R]`` starts a
throwaway redis-server, loads the GCRA script and runs it N times per round with
one and with eight concurrent callers, through redis-py with the hiredis parser
(what the gateway uses), redis-py with its pure-Python parser, and coredis when it
is installed (``pip install coredis``; it is not a dependency). Clients alternate
inside each round; the figure is the median over the rounds of this process's CPU
time per call, so a busy machine moves the wall time more than the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import importlib
import importlib.util
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis.asyncio as aioredis
import uvloop
from redis._parsers import _AsyncRESP2Parser
from redis.utils import HIREDIS_AVAILABLE

from ballast_asgi.ratelimit.scripts import GCRA
from experiments._harness.redis import redis_server

SHA = hashlib.sha1(GCRA.encode()).hexdigest()
ARGS = ("0.001", "0.1", "1")
Call = Callable[[str], Awaitable[Any]]


async def cpu_per_call(call: Call, calls: int, callers: int) -> float:
    """Microseconds of this process's CPU per call, ``callers`` at a time."""

    async def caller(k: int) -> None:
        for _ in range(calls // callers):
            await call(f"bench-{k}")

    start = time.process_time()
    await asyncio.gather(*(caller(k) for k in range(callers)))
    return (time.process_time() - start) / calls * 1e6


async def _main(url: str, calls: int, rounds: int) -> None:
    clients: dict[str, Call] = {}
    closers: list[Callable[[], Awaitable[Any]]] = []
    fast = aioredis.Redis.from_url(url, decode_responses=True)
    await fast.script_load(GCRA)
    label = "redis-py + hiredis" if HIREDIS_AVAILABLE else "redis-py (hiredis missing)"
    clients[label] = lambda k: fast.evalsha(SHA, 1, k, *ARGS)
    pure = aioredis.Redis.from_url(url, decode_responses=True, parser_class=_AsyncRESP2Parser)
    clients["redis-py, pure parser"] = lambda k: pure.evalsha(SHA, 1, k, *ARGS)
    closers += [fast.aclose, pure.aclose]
    if importlib.util.find_spec("coredis") is not None:
        coredis = importlib.import_module("coredis")  # optional: not a dependency
        other = coredis.Redis.from_url(url, decode_responses=True)
        await other.__aenter__()
        clients["coredis " + coredis.__version__] = lambda k: other.evalsha(
            SHA, keys=[k], args=list(ARGS)
        )
        closers.append(lambda: other.__aexit__(None, None, None))
    else:
        print("coredis not installed: pip install coredis to compare it")
    try:
        for callers in (1, 8):
            got: dict[str, list[float]] = {name: [] for name in clients}
            for _ in range(rounds):
                for name, call in clients.items():
                    got[name].append(await cpu_per_call(call, calls, callers))
            for name, values in got.items():
                spread = ", ".join(f"{v:.0f}" for v in sorted(values))
                print(f"{callers} caller(s)  {name:28s} {statistics.median(values):5.0f} us"
                      f" CPU per call  (rounds: {spread})")  # fmt: skip
    finally:
        for close in closers:
            await close()


def main() -> None:
    """Parse the arguments, start redis-server, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000, help="calls per client and round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (the median is shown)")
    opts = parser.parse_args()
    with redis_server() as server:
        uvloop.run(_main(server.url, opts.calls, opts.rounds))


if __name__ == "__main__":
    main()
