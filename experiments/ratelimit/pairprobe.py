"""Two shared-mode drivers in one process, open loop, compared with a perfect bucket.

``python -m experiments.ratelimit.pairprobe MODE [--seconds S] [--split even|shifting]
[--redis-delay-ms D] [--busy-us U]`` starts a throwaway redis-server (behind the
delaying proxy when ``D`` > 0), builds two drivers of ``MODE`` on one key
(limit 1,000/s, burst 100), and offers 1,500 decisions a second between them,
each decision a task started at its scheduled time (nobody waits for the one
before). ``--busy-us`` burns that much CPU per request in the same event loop, to
imitate a gateway whose loop runs late. It prints admitted against a perfect
single bucket replayed over the moments the decisions were made (a loop that falls
behind decides over a longer stretch than the schedule), and where the decisions
came from.

This is the controlled harness for rules that the HTTP experiment (two gateway
processes on a saturated two-core machine) cannot tell apart; it leaves out
HTTP, the second process and the machine's other work, so read it as a
comparison of driver rules, not as gateway numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from typing import Any

import uvloop

from ballast_asgi.config.ratelimit import RateLimitConfig
from ballast_asgi.ratelimit.core.gcra import Limits, ReferenceBucket
from ballast_asgi.ratelimit.factory import RateLimiter, make_limiter
from experiments._harness.redis import start_redis
from experiments.ratelimit.delayproxy import DelayProxy

RATE = 1500.0
LIMITS = Limits(1000.0, 100)


def _share(split: str, t: float) -> float:
    if split == "even":
        return 0.5
    return 0.9 if int(t // 5.0) % 2 == 0 else 0.1


async def probe(
    mode: str, seconds: float, split: str, delay_s: float, busy_us: float
) -> dict[str, Any]:
    """One run; returns admitted, perfect and the decision counts of both drivers."""
    server = start_redis()
    proxy = DelayProxy(server.port, delay_s).start() if delay_s > 0 else None
    url = proxy.url if proxy else server.url
    cfg = {"enabled": True, "mode": mode, "redis_url": url, "key_prefix": uuid.uuid4().hex}
    lims: list[RateLimiter] = [make_limiter(RateLimitConfig.model_validate(cfg)) for _ in range(2)]
    decided: list[tuple[float, bool]] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(gw: int, t: float) -> None:
        # The perfect bucket replays the moments the decisions were made, not the schedule:
        # a loop that falls behind decides later, over a longer stretch of time.
        allowed = (await lims[gw].decide("k", LIMITS)).allowed
        decided.append((time.perf_counter(), allowed))

    try:
        for lim in lims:
            await lim.start()
        for lim in lims:
            await lim.start()  # the second heartbeat round sees both gateways
        rng = random.Random(1)
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        for i in range(int(RATE * seconds)):
            t = i / RATE
            delay = start + t - time.perf_counter()
            # Yield at least once per request, so the loop reads its sockets even when behind.
            await asyncio.sleep(max(0.0, delay))
            end = time.perf_counter() + busy_us / 1e6
            while time.perf_counter() < end:
                pass
            gw = 0 if rng.random() < _share(split, t) else 1
            task = loop.create_task(one(gw, t))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
    finally:
        for lim in lims:
            await lim.close()
        if proxy:
            proxy.stop()
        server.stop()
    decided.sort()
    bucket = ReferenceBucket(LIMITS, decided[0][0] if decided else 0.0)
    perfect = sum(bucket.take(t) for t, _ in decided)
    admitted = sum(ok for _, ok in decided)
    return {
        "admitted": admitted,
        "perfect": perfect,
        "net_pct": 100.0 * (admitted - perfect) / perfect,
        "decisions": [dict(lim.stats.decisions) for lim in lims],
    }


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run once, print one line per run."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["redis", "lease", "sync"])
    ap.add_argument("--seconds", type=float, default=10.5)
    ap.add_argument("--split", choices=["even", "shifting"], default="shifting")
    ap.add_argument("--redis-delay-ms", type=float, default=0.0)
    ap.add_argument("--busy-us", type=float, default=0.0)
    args = ap.parse_args(argv)
    row = uvloop.run(
        probe(args.mode, args.seconds, args.split, args.redis_delay_ms / 1000, args.busy_us)
    )
    print(
        f"{args.mode} {args.split} redis+{args.redis_delay_ms:g} ms busy {args.busy_us:g} us: "
        f"admitted {row['admitted']} perfect {row['perfect']} ({row['net_pct']:+.2f} %)"
    )
    for i, counts in enumerate(row["decisions"]):
        print(f"  gateway {i}: " + ", ".join(f"{k[0]}/{k[1]} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
