"""Overload end to end in process: 8 workers offered ~4x capacity; critical served, bulk shed.

The upstream simulates service time on the event loop (asyncio.sleep inside the
app under test); the test itself never sleeps to wait for an outcome: it awaits
every request it issued.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from ballast_asgi.core.limit import make_limit
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.queue import PriorityQueue
from ballast_asgi.core.types import ASGIApp, Message, Receive, Scope, Send
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware
from ballast_asgi.middleware.context import get_context
from ballast_asgi.middleware.queueing import QueueMiddleware
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.telemetry.metrics import null_metrics

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

WORKERS, SERVICE_S = 8, 0.025
CAPACITY_RPS = WORKERS / SERVICE_S  # 320
OFFERED_RPS, DURATION_S = 4 * CAPACITY_RPS, 2.0
TIERS = (("critical", 0.05, 400), ("standard", 0.35, 1000), ("bulk", 0.60, 3000))
QUEUE_SIZE = 200


class Workers:
    """An upstream with a FIFO queue in front of a fixed pool of workers."""

    def __init__(self) -> None:
        self.pool = asyncio.Semaphore(WORKERS)
        self.busy = 0
        self.max_busy = 0
        self.served = Counter[str]()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = asyncio.get_running_loop().time()
        async with self.pool:
            self.busy += 1
            self.max_busy = max(self.max_busy, self.busy)
            await asyncio.sleep(SERVICE_S)  # simulated service time
            self.busy -= 1
        self.served[scope["path"]] += 1
        # Record the attempt as the proxy does (the limiter's RTT sample).
        get_context(scope).record_status(200, asyncio.get_running_loop().time() - started)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def build(upstream: ASGIApp) -> tuple[ASGIApp, Limiter, PriorityQueue]:
    metrics = null_metrics()
    responder = ShedResponder(metrics, rng=random.Random(3))
    limiter = Limiter(make_limit("gradient", initial_limit=20, min_limit=4, max_limit=200))
    queue = PriorityQueue(max_size=QUEUE_SIZE, lifo_threshold=16)
    app: ASGIApp = ConcurrencyMiddleware(
        upstream, limiter=limiter, responder=responder, metrics=metrics
    )
    app = QueueMiddleware(app, limiter=limiter, queue=queue, responder=responder, metrics=metrics)
    app = AdmissionMiddleware(app, responder=responder, metrics=metrics)
    return app, limiter, queue


async def one_request(app: ASGIApp, tier: str, deadline_ms: int) -> tuple[str, str]:
    """Issue one request; return (tier, "served" or the shed reason)."""
    done = asyncio.Event()
    sent: list[Message] = []
    first = True

    async def receive() -> Message:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    headers = [(b"x-priority", tier.encode()), (b"x-deadline-ms", str(deadline_ms).encode())]
    scope: Scope = {"type": "http", "method": "GET", "path": f"/{tier}", "headers": headers}
    await app(scope, receive, send)
    done.set()
    start = sent[0]
    if start["status"] == 200:
        return tier, "served"
    reason = dict(start["headers"])[b"x-ballast-reason"].decode()
    return tier, reason


async def test_critical_served_bulk_shed_under_4x_overload() -> None:
    """At ~4x capacity nearly all critical requests are served while most bulk is shed."""
    upstream = Workers()
    app, limiter, queue = build(upstream)
    rng = random.Random(42)
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[tuple[str, str]]] = []
    max_depth = 0

    def issue() -> None:
        nonlocal max_depth
        r = rng.random()
        for tier, share, deadline_ms in TIERS:
            r -= share
            if r < 0 or tier == "bulk":
                tasks.append(loop.create_task(one_request(app, tier, deadline_ms)))
                break
        max_depth = max(max_depth, queue.total)
        if len(tasks) == count:
            all_issued.set()

    all_issued = asyncio.Event()
    count = int(OFFERED_RPS * DURATION_S)
    t0 = loop.time()
    for i in range(count):
        loop.call_at(t0 + i / OFFERED_RPS, issue)
    await all_issued.wait()
    results = await asyncio.gather(*tasks)

    by_tier = {tier: Counter(outcome for t, outcome in results if t == tier) for tier, *_ in TIERS}
    crit, bulk = by_tier["critical"], by_tier["bulk"]
    crit_served = crit["served"] / sum(crit.values())
    bulk_served = bulk["served"] / sum(bulk.values())
    assert crit_served >= 0.95, by_tier
    assert bulk_served <= 0.5, by_tier
    assert max_depth <= QUEUE_SIZE
    assert limiter.inflight == 0 and queue.total == 0
    assert sum(upstream.served.values()) == sum(c["served"] for c in by_tier.values())
