"""How long one gateway's decisions take before and after Redis stops, without a busy machine.

``python -m experiments.ratelimit.outage [--modes redis,lease,sync] [--decisions N] [--rps R]``
starts a throwaway redis-server, builds each shared-mode driver in this process
(the gateway's own code, no HTTP), paces N decisions at R per second, kills Redis
(SIGKILL) and paces N more. It prints the decision wait (p50, p99, max) and this
process's CPU per decision, the pacing loop's own ~0.1 ms included, for both
halves. The HTTP experiment (``make experiment-ratelimit``) measures the same
waits inside two gateways on a saturated machine, where every wait that crosses
the event loop also carries the loop's lag; this one shows what the drivers
themselves cost.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from dataclasses import dataclass

import uvloop

from ballast_asgi.config.ratelimit import RateLimitConfig
from ballast_asgi.ratelimit.core.gcra import Limits
from ballast_asgi.ratelimit.factory import RateLimiter, make_limiter
from experiments._harness.redis import start_redis


@dataclass
class Half:
    """One half of a run: decision waits (seconds) and CPU seconds used."""

    waits: list[float]
    cpu_s: float
    degraded: int

    def line(self, name: str) -> str:
        """One printed row."""
        w = sorted(self.waits)
        n = len(w)
        return (
            f"{name:6s} wait p50 {w[n // 2] * 1e3:6.3f} ms  p99 {w[int(n * 0.99)] * 1e3:6.3f} ms"
            f"  max {w[-1] * 1e3:7.3f} ms  CPU {self.cpu_s / n * 1e6:4.0f} us/decision (pacing"
            " included)"
            f"  decided alone {self.degraded} of {n}"
        )


async def paced(lim: RateLimiter, limits: Limits, n: int, rps: float) -> Half:
    """``n`` decisions for one key at ``rps``, each timed."""
    waits: list[float] = []
    before = sum(v for (_, src), v in lim.stats.decisions.items() if src == "degraded")
    cpu0 = time.process_time()
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rps - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        t = time.perf_counter()
        await lim.decide("k", limits)
        waits.append(time.perf_counter() - t)
    after = sum(v for (_, src), v in lim.stats.decisions.items() if src == "degraded")
    return Half(waits, time.process_time() - cpu0, after - before)


async def one_mode(mode: str, n: int, rps: float) -> tuple[Half, Half]:
    """Alive, then stopped, for one mode (default config, 2 ms Redis timeout)."""
    server = start_redis()
    cfg = RateLimitConfig.model_validate(
        {"enabled": True, "mode": mode, "redis_url": server.url, "key_prefix": uuid.uuid4().hex}
    )
    lim = make_limiter(cfg)
    limits = Limits(1000.0, 100)
    try:
        await lim.start()
        alive = await paced(lim, limits, n, rps)
        server.kill()
        stopped = await paced(lim, limits, n, rps)
    finally:
        await lim.close()
        server.stop()
    return alive, stopped


def main() -> None:
    """Parse the arguments and print two rows per mode."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", default="redis,lease,sync")
    parser.add_argument("--decisions", type=int, default=3000, help="per half")
    parser.add_argument("--rps", type=float, default=750.0, help="one gateway's share of 1,500")
    opts = parser.parse_args()
    for mode in opts.modes.split(","):
        alive, stopped = uvloop.run(one_mode(mode, opts.decisions, opts.rps))
        print(f"{mode}:")
        print("  " + alive.line("alive"))
        print("  " + stopped.line("killed"))


if __name__ == "__main__":
    main()
