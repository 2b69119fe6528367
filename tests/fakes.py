"""Test fakes shared by the suite: a controllable clock, a recording limit, tiny upstreams.

Upstreams: ``StatusUpstream`` (a fixed status, counts calls, records the outcome),
``EchoUpstream`` (echoes the body, records the order served) as ASGI apps;
``EchoHandler`` and ``HoldingHandler`` as ``httpx.MockTransport`` handlers;
``CountingGateway``: the gateway, counting the HTTP requests that reach it as ASGI calls.

Fakes, not mocks: each is a small real implementation of the seam it stands in for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import anyio.lowlevel
import httpx

from ballast_asgi.core.limit import FixedLimit, Sample
from ballast_asgi.core.types import Message, Receive, Scope, Send
from ballast_asgi.gateway import Gateway
from ballast_asgi.middleware.context import find_context
from ballast_asgi.proxy.upstream import SingleUpstream, Upstream


class FakeClock:
    """Monotonic seconds that only move when told to."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds


class RecordingLimit(FixedLimit):
    """A fixed limit remembering every sample it was given."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.samples: list[Sample] = []

    def on_sample(self, sample: Sample, now: float) -> int:
        self.samples.append(sample)
        return self.limit


class StatusUpstream:
    """An in-process upstream app: answers ``status`` with ``body``, recording the outcome.

    It records the attempt's outcome on the request context before the head, as
    the proxy does, and counts its calls.
    """

    def __init__(self, status: int = 200, body: bytes = b"ok") -> None:
        self.status = status
        self.body = body
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        ctx = find_context(scope)
        if ctx is not None:
            ctx.record_status(self.status)
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": self.body})


class EchoUpstream:
    """An in-process upstream app: answers 200 with the request body (else the path).

    It reads the whole body first and records the paths in the order it served them.
    """

    def __init__(self) -> None:
        self.served: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.served.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body or scope["path"].encode()})


class EchoHandler:
    """An ``httpx.MockTransport`` handler: counts calls, echoes the path and X-Deadline-Ms."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        deadline = request.headers.get("x-deadline-ms", "")
        return httpx.Response(200, json={"path": request.url.path, "deadline": deadline})


class HoldingHandler:
    """An async ``httpx.MockTransport`` handler that parks requests until ``gate`` is set.

    Paths starting with ``hold`` wait (bounded by ``wait_s``); it records the
    arrival order and the most requests it held at once (``peak``).
    """

    def __init__(self, hold: str = "/", wait_s: float = 5.0) -> None:
        self.hold = hold
        self.wait_s = wait_s
        self.gate = asyncio.Event()
        self.arrived: list[str] = []
        self.active = 0
        self.peak = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.arrived.append(request.url.path)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            if request.url.path.startswith(self.hold):
                await asyncio.wait_for(self.gate.wait(), self.wait_s)
        finally:
            self.active -= 1
        return httpx.Response(200, json={"path": request.url.path})


async def until(condition: Callable[[], bool], rounds: int = 20_000) -> None:
    """Yield to the loop until ``condition`` holds (bounded; no timed sleeps)."""
    for _ in range(rounds):
        if condition():
            return
        await anyio.lowlevel.checkpoint()
    raise AssertionError("condition never became true")


def request_messages(body: bytes = b"", chunk: int = 0) -> list[Message]:
    """The ``http.request`` messages carrying ``body`` (in ``chunk``-sized pieces if > 0)."""
    if chunk <= 0 or len(body) <= chunk:
        return [{"type": "http.request", "body": body, "more_body": False}]
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    return [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
        for i, p in enumerate(pieces)
    ]


class BodyEnds(SingleUpstream):
    """The default selector, remembering how each response body ended (``report_body``)."""

    __slots__ = ("ends",)

    def __init__(self, url: str) -> None:
        super().__init__(Upstream.parse(url))
        self.ends: list[bool] = []

    def report_body(self, upstream: Upstream, complete: bool, now: float) -> None:
        self.ends.append(complete)


class CountingGateway(Gateway):
    """A gateway that counts the HTTP requests that reach it as ASGI calls."""

    calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.calls += 1
        await super().__call__(scope, receive, send)
