"""Open-loop load across the gateways: a fixed schedule, every outcome recorded.

Request ``i`` is due at ``start + i / rate_rps`` and goes to gateway
``i % len(targets)``, whether or not earlier ones returned. A request is
*lost* unless it gets a 2xx: a 5xx, a shed (429), a client timeout or a
connection error all count. Requests that could not be issued on time (the
generator fell more than 50 ms behind) are counted separately.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field

import aiohttp

LATE_S = 0.05


@dataclass
class LoadResult:
    """What one run of load saw."""

    sent: int = 0
    ok: int = 0
    late: int = 0
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    #: (wall time, what) of each lost request, for the timeline.
    lost_at: list[tuple[float, str]] = field(default_factory=list)

    @property
    def lost(self) -> int:
        """Requests without a 2xx answer."""
        return self.sent - self.ok


async def drive(
    http: aiohttp.ClientSession,
    targets: list[str],
    rate_rps: float,
    duration_s: float,
    request_timeout_s: float = 3.0,
) -> LoadResult:
    """Send ``rate_rps * duration_s`` GETs over ``targets``; wait for every answer."""
    result = LoadResult()
    loop = asyncio.get_running_loop()
    start = loop.time()
    total = int(rate_rps * duration_s)
    tasks: set[asyncio.Task[None]] = set()
    client_timeout = aiohttp.ClientTimeout(total=request_timeout_s)
    for i in range(total):
        due = start + i / rate_rps
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        elif -delay > LATE_S:
            result.late += 1
        url = targets[i % len(targets)]
        task = asyncio.ensure_future(_one(http, url, client_timeout, result))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return result


async def _one(
    http: aiohttp.ClientSession, url: str, limits: aiohttp.ClientTimeout, result: LoadResult
) -> None:
    result.sent += 1
    try:
        async with http.get(url, timeout=limits) as response:
            await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        _lose(result, type(exc).__name__)
        return
    if 200 <= status < 300:
        result.ok += 1
    else:
        _lose(result, str(status))


def _lose(result: LoadResult, what: str) -> None:
    result.failures[what] += 1
    result.lost_at.append((time.time(), what))
