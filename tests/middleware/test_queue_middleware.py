"""QueueMiddleware: waiting for a permit, priority order, LIFO tail, expiry, disconnects."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio.lowlevel
import httpx
import pytest

from ballast_asgi.core.limit import FixedLimit
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.core.outcome import Outcome
from ballast_asgi.core.queue import PriorityQueue
from ballast_asgi.core.types import Message, Receive, Scope, Send
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware
from ballast_asgi.middleware.context import get_context
from ballast_asgi.middleware.queueing import QueueMiddleware
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.telemetry.metrics import Metrics, null_metrics
from tests.fakes import EchoUpstream, until

pytestmark = pytest.mark.anyio


class Stack:
    """Admission -> Queue -> Concurrency -> Upstream over a fixed limit."""

    def __init__(self, limit: int = 1, clock: Any = None, **queue_kw: Any) -> None:
        timeout_ms = queue_kw.pop("queue_timeout_ms", None)
        clocked: dict[str, Any] = {} if clock is None else {"clock": clock}
        self.metrics: Metrics = null_metrics()
        self.limiter = Limiter(FixedLimit(limit))
        self.queue = PriorityQueue(**queue_kw)
        self.upstream = EchoUpstream()
        responder = ShedResponder(self.metrics)
        inner = ConcurrencyMiddleware(
            self.upstream,
            limiter=self.limiter,
            responder=responder,
            metrics=self.metrics,
            **clocked,
        )
        queued = QueueMiddleware(
            inner,
            limiter=self.limiter,
            queue=self.queue,
            responder=responder,
            metrics=self.metrics,
            queue_timeout_ms=timeout_ms,
            **clocked,
        )
        self.app = AdmissionMiddleware(queued, responder=responder, metrics=self.metrics, **clocked)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://gw"
        )

    def hold(self) -> Any:
        """Take the only permit(s) so newcomers must queue; release with .release()."""
        permit = self.limiter.try_acquire(asyncio.get_running_loop().time())
        assert permit is not None
        return permit

    def request(self, path: str, **headers: str) -> asyncio.Task[httpx.Response]:
        hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
        return asyncio.ensure_future(self.client.get(path, headers=hdrs))

    def count(self, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "ballast_admission_queued_total", {"outcome": outcome}
        )
        return value or 0.0


async def queue_in_order(stack: Stack, *specs: tuple[str, str]) -> list[asyncio.Task[Any]]:
    tasks = []
    for path, tier in specs:
        tasks.append(stack.request(path, X_Priority=tier))
        depth = len(tasks)
        await until(lambda depth=depth: stack.queue.total == depth)  # type: ignore[misc]
    return tasks


async def test_free_permit_passes_straight_through() -> None:
    """With a free permit the request is served at once and nothing is queued."""
    stack = Stack(limit=2)
    resp = await stack.client.get("/a")
    assert resp.status_code == 200
    assert stack.limiter.inflight == 0
    assert stack.count("admitted") == 0


async def test_critical_overtakes_bulk() -> None:
    """When a permit frees, the critical waiter is served before earlier bulk ones."""
    stack = Stack()
    held = stack.hold()
    tasks = await queue_in_order(stack, ("/b1", "bulk"), ("/b2", "bulk"), ("/c", "critical"))
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())
    responses = await asyncio.gather(*tasks)
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert stack.upstream.served == ["/c", "/b1", "/b2"]
    assert stack.count("admitted") == 3


async def test_lifo_tail_serves_newest_first_above_threshold() -> None:
    """Above lifo_threshold a tier is served newest first, then FIFO again."""
    stack = Stack(lifo_threshold=2)
    held = stack.hold()
    specs = [(f"/s{i}", "standard") for i in range(4)]
    tasks = await queue_in_order(stack, *specs)
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())
    await asyncio.gather(*tasks)
    assert stack.upstream.served == ["/s3", "/s2", "/s0", "/s1"]


async def test_full_queue_refuses_with_queue_full() -> None:
    """A newcomer with nothing lower to displace gets 429 queue_full."""
    stack = Stack(max_size=1, per_priority=False)
    held = stack.hold()
    (first,) = await queue_in_order(stack, ("/s0", "standard"))
    refused = await stack.client.get("/s1", headers={"X-Priority": "standard"})
    assert refused.status_code == 429
    assert refused.headers["x-ballast-reason"] == "queue_full"
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())
    assert (await first).status_code == 200
    assert stack.count("queue_full") == 1


async def test_critical_newcomer_displaces_bulk_waiter() -> None:
    """A critical newcomer into a full queue sheds the bulk waiter with queue_full."""
    stack = Stack(max_size=1, per_priority=False)
    held = stack.hold()
    (bulk,) = await queue_in_order(stack, ("/b", "bulk"))
    critical = stack.request("/c", X_Priority="critical")
    shed = await bulk
    assert shed.status_code == 429
    assert shed.headers["x-ballast-reason"] == "queue_full"
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())
    assert (await critical).status_code == 200
    assert stack.upstream.served == ["/c"]


async def test_deadline_sheds_the_waiter_while_the_permit_is_still_held() -> None:
    """A queued request is shed by its timer the moment its deadline passes."""
    stack = Stack()
    held = stack.hold()
    resp = await stack.client.get("/late", headers={"X-Deadline-Ms": "20"})
    assert resp.status_code == 429
    assert resp.headers["x-ballast-reason"] == "deadline"
    assert stack.queue.total == 0 and stack.limiter.inflight == 1
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())
    assert stack.count("timeout") == 1
    assert stack.upstream.served == []


async def test_queue_timeout_sheds_with_queue_timeout() -> None:
    """The optional queue timeout sheds a waiter with reason queue_timeout."""
    stack = Stack(queue_timeout_ms=15)
    held = stack.hold()
    resp = await stack.client.get("/slow", headers={"X-Deadline-Ms": "5000"})
    assert resp.headers["x-ballast-reason"] == "queue_timeout"
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())


async def test_body_sent_while_queued_is_replayed() -> None:
    """Request body read while waiting reaches the inner app intact."""
    stack = Stack()
    held = stack.hold()
    task = asyncio.ensure_future(stack.client.post("/echo", content=b"payload"))
    await until(lambda: stack.queue.total == 1)
    await anyio.lowlevel.checkpoint()
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())
    resp = await task
    assert resp.content == b"payload"


class RawClient:
    """Drives the ASGI app directly, so a test can disconnect mid-wait."""

    def __init__(self, app: Any, path: str = "/raw") -> None:
        self.app = app
        self.scope: Scope = {
            "type": "http", "method": "GET", "path": path, "headers": [],
            "query_string": b"", "http_version": "1.1", "scheme": "http",
            "server": ("gw", 80), "client": ("127.0.0.1", 1), "root_path": "",
        }  # fmt: skip
        self.gone = asyncio.Event()
        self.sent: list[Message] = []
        self._body_sent = False

    async def receive(self) -> Message:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def start(self) -> asyncio.Task[None]:
        return asyncio.ensure_future(self.app(self.scope, self.receive, self.send))


async def test_disconnect_while_queued_removes_the_waiter() -> None:
    """A client that disconnects while queued leaves the queue and costs no upstream work."""
    stack = Stack()
    held = stack.hold()
    raw = RawClient(stack.app)
    task = raw.start()
    await until(lambda: stack.queue.total == 1)
    raw.gone.set()
    await task
    assert raw.sent == []
    assert stack.queue.total == 0
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())
    assert stack.upstream.served == []
    assert stack.limiter.inflight == 0


async def test_cancelled_waiter_leaves_the_queue_and_reraises() -> None:
    """Cancelling a waiting request propagates CancelledError and leaves nothing queued."""
    stack = Stack()
    held = stack.hold()
    task = RawClient(stack.app).start()
    await until(lambda: stack.queue.total == 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stack.queue.total == 0
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())


async def test_permit_granted_to_a_cancelled_waiter_goes_to_the_next() -> None:
    """A waiter cancelled right after being granted hands its permit to the next waiter."""
    stack = Stack()
    held = stack.hold()
    first = RawClient(stack.app, "/first")
    second = RawClient(stack.app, "/second")
    t1 = first.start()
    await until(lambda: stack.queue.total == 1)
    t2 = second.start()
    await until(lambda: stack.queue.total == 2)
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())  # grants /first
    t1.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await t1
    await t2
    assert stack.upstream.served == ["/second"]
    assert stack.limiter.inflight == 0 and stack.queue.total == 0


async def test_grant_at_the_deadline_instant_passes_the_permit_on() -> None:
    """A waiter granted just as its deadline passed is shed and the permit moves on."""
    loop = asyncio.get_running_loop()
    offset = [0.0]
    stack = Stack(clock=lambda: loop.time() + offset[0])
    held = stack.hold()
    late = stack.request("/late", X_Deadline_Ms="10000")
    await until(lambda: stack.queue.total == 1)
    other = stack.request("/other")
    await until(lambda: stack.queue.total == 2)
    offset[0] = 20.0  # the clock jumps past /late's deadline before its timer fires
    held.release(Outcome.SUCCESS, loop.time())
    shed, served = await asyncio.gather(late, other)
    assert shed.headers["x-ballast-reason"] == "deadline"
    assert served.status_code == 200
    assert stack.upstream.served == ["/other"]
    assert stack.count("timeout") == 1


async def test_queue_depth_metric_is_bound() -> None:
    """The queue-depth gauge reads the live queue at scrape time."""
    stack = Stack()
    held = stack.hold()
    tasks = await queue_in_order(stack, ("/b", "bulk"))
    value = stack.metrics.registry.get_sample_value(
        "ballast_admission_queue_depth", {"priority": "bulk"}
    )
    assert value == 1
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())
    await asyncio.gather(*tasks)


async def test_queue_wait_is_recorded_on_the_context() -> None:
    """The granted request's context carries its queue wait."""
    seen: list[float] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(get_context(scope).queue_wait_s)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    stack = Stack()
    stack.upstream = app  # type: ignore[assignment]
    stack.app.app.app.app = app  # type: ignore[attr-defined]
    held = stack.hold()
    task = stack.request("/w")
    await until(lambda: stack.queue.total == 1)
    held.release(Outcome.SUCCESS, asyncio.get_running_loop().time())
    await task
    assert len(seen) == 1 and seen[0] >= 0.0


def test_rejects_bad_queue_timeout() -> None:
    """A non-positive queue timeout is a ValueError naming the field."""
    metrics = null_metrics()
    with pytest.raises(ValueError, match="queue_timeout_ms"):
        QueueMiddleware(
            EchoUpstream(),
            limiter=Limiter(FixedLimit(1)),
            queue=PriorityQueue(),
            responder=ShedResponder(metrics),
            metrics=metrics,
            queue_timeout_ms=0,
        )
