"""Issue 13.1, 11.3, 11.8: bodies stream both ways, bounded phases, aborts, never truncation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from ballast_asgi.config import ProxyConfig
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.middleware.context import RequestContext, with_context
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.body import ClientSendTimeout, UpstreamBodyError
from ballast_asgi.telemetry.metrics import Metrics
from tests.fakes import BodyEnds

Message = dict[str, Any]


def _scope(method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None) -> Message:
    return {"type": "http", "method": method, "path": "/s", "raw_path": b"/s",
            "query_string": b"", "headers": headers or [], "client": ("10.0.0.1", 1),
            "scheme": "http", "root_path": ""}  # fmt: skip


class _Transport(httpx.AsyncBaseTransport):
    """Answers 200 with a body produced by ``body()``; keeps what it saw."""

    def __init__(self, body: Any, status: int = 200, headers: Any = ()) -> None:
        self.body = body
        self.status = status
        self.headers = list(headers)
        self.requests: list[httpx.Request] = []
        self.received: list[bytes] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if isinstance(request.stream, httpx.AsyncByteStream) and not isinstance(
            request.stream, httpx.ByteStream
        ):
            async for chunk in request.stream:
                self.received.append(chunk)
        return httpx.Response(self.status, headers=self.headers, stream=_Stream(self.body()))


class _Stream(httpx.AsyncByteStream):
    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            yield chunk


def _receive_once(body: bytes = b"") -> Any:
    sent = False
    never = asyncio.Event()

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    return receive


@pytest.mark.anyio
async def test_response_streams_before_the_upstream_finishes() -> None:
    """The first chunk reaches the client while the upstream is still producing (SSE)."""
    release = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        await release.wait()
        yield b"data: 2\n\n"

    app = ProxyApp("http://u.test", transport=_Transport(body))
    sent: list[Message] = []
    first = asyncio.Event()

    async def send(message: Message) -> None:
        sent.append(message)
        if message.get("body"):
            first.set()

    task = asyncio.ensure_future(app(_scope(), _receive_once(), send))
    await asyncio.wait_for(first.wait(), 5)
    assert [m.get("body") for m in sent if m["type"] == "http.response.body"] == [b"data: 1\n\n"]
    release.set()
    await asyncio.wait_for(task, 5)
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


@pytest.mark.anyio
async def test_slow_client_pauses_upstream_reads() -> None:
    """While the client's send is blocked, no further upstream chunk is read (backpressure)."""
    pulled = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(100):
            pulled += 1
            yield b"x" * 1024

    gate = asyncio.Event()
    blocked = asyncio.Event()

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            blocked.set()
            await gate.wait()

    app = ProxyApp("http://u.test", transport=_Transport(body))
    task = asyncio.ensure_future(app(_scope(), _receive_once(), send))
    await asyncio.wait_for(blocked.wait(), 5)
    for _ in range(20):
        await asyncio.sleep(0)  # let anything that could read ahead run
    assert pulled == 1
    gate.set()
    await asyncio.wait_for(task, 5)
    assert pulled == 100


@pytest.mark.anyio
async def test_client_that_stops_reading_is_aborted_and_counted() -> None:
    """A send that does not finish within send_timeout_ms aborts the response (counted)."""

    async def body() -> AsyncIterator[bytes]:
        yield b"a" * 20_000  # past the untimed 16 KiB
        yield b"b"

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            await asyncio.Event().wait()  # the client never reads

    metrics = Metrics(CollectorRegistry())
    app = ProxyApp("http://u.test", transport=_Transport(body), metrics=metrics,
                   config=ProxyConfig(send_timeout_ms=20))  # fmt: skip
    with pytest.raises(ClientSendTimeout):
        await asyncio.wait_for(app(_scope(), _receive_once(), send), 5)
    assert metrics.client_send_timeouts._value.get() == 1


@pytest.mark.anyio
async def test_upstream_failure_mid_body_aborts_instead_of_finishing() -> None:
    """A reset after the head raises (the server aborts the connection); no final empty chunk."""

    async def body() -> AsyncIterator[bytes]:
        yield b"partial"
        raise httpx.ReadError("reset")

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    app = ProxyApp("http://u.test", transport=_Transport(body))
    with pytest.raises(UpstreamBodyError):
        await app(with_context(_scope(), ctx), _receive_once(), send)
    assert sent[0]["status"] == 200
    assert all(m.get("more_body", False) for m in sent[1:])
    assert ctx.outcome is AttemptOutcome.SUCCESS  # recorded at the head; the abort is raised


@pytest.mark.anyio
async def test_the_selector_hears_how_each_body_ended() -> None:
    """A whole body and a body cut by the upstream are both reported after the head."""

    async def whole() -> AsyncIterator[bytes]:
        yield b"all of it"

    async def cut() -> AsyncIterator[bytes]:
        yield b"partial"
        raise httpx.ReadError("reset")

    async def send(message: Message) -> None:
        return None

    selector = BodyEnds("http://u.test")
    await ProxyApp(selector=selector, transport=_Transport(whole))(_scope(), _receive_once(), send)
    with pytest.raises(UpstreamBodyError):
        await ProxyApp(selector=selector, transport=_Transport(cut))(
            _scope(), _receive_once(), send
        )
    assert selector.ends == [True, False]


@pytest.mark.anyio
async def test_head_rtt_is_time_to_head_not_stream_length() -> None:
    """The RTT recorded is the time to the response head; a long body does not move it."""
    now = [0.0]

    async def body() -> AsyncIterator[bytes]:
        now[0] += 60.0  # a minute of streaming
        yield b"tick"

    class _Slow(_Transport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            now[0] += 0.005
            return await super().handle_async_request(request)

    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    app = ProxyApp("http://u.test", transport=_Slow(body), clock=lambda: now[0])

    async def send(message: Message) -> None:
        return None

    await app(with_context(_scope(), ctx), _receive_once(), send)
    assert ctx.rtt_s == pytest.approx(0.005)
    assert ctx.outcome is AttemptOutcome.SUCCESS


@pytest.mark.anyio
async def test_deadline_bounds_the_wait_for_the_head() -> None:
    """An upstream that never answers is cut at the request's deadline: 504, outcome deadline."""

    class _Hang(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    ctx = RequestContext(arrival=0.0, deadline=time.monotonic() + 0.05, priority=Priority.STANDARD)
    app = ProxyApp("http://u.test", transport=_Hang())
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await asyncio.wait_for(app(with_context(_scope(), ctx), _receive_once(), send), 5)
    assert sent[0]["status"] == 504
    assert ctx.outcome is AttemptOutcome.DEADLINE


def _chunked_receive(chunks: list[bytes], gate: asyncio.Event) -> Any:
    """Delivers the first chunk at once and the rest after ``gate``."""
    queue = list(chunks)

    async def receive() -> Message:
        if len(queue) < len(chunks):
            await gate.wait()
        if queue:
            chunk = queue.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(queue)}
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    return receive


@pytest.mark.anyio
async def test_chunked_request_body_streams_upstream_as_it_arrives() -> None:
    """A chunked upload reaches the upstream chunk by chunk, before the client has finished."""
    gate = asyncio.Event()
    seen_first = asyncio.Event()

    class _Reader(_Transport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            assert isinstance(request.stream, httpx.AsyncByteStream)
            async for chunk in request.stream:
                self.received.append(chunk)
                seen_first.set()
            return httpx.Response(200, content=b"ok")

    async def nobody() -> AsyncIterator[bytes]:
        yield b""

    transport = _Reader(nobody)
    app = ProxyApp("http://u.test", transport=transport)
    scope = _scope("POST", [(b"transfer-encoding", b"chunked")])

    async def send(message: Message) -> None:
        return None

    task = asyncio.ensure_future(app(scope, _chunked_receive([b"one", b"two"], gate), send))
    await asyncio.wait_for(seen_first.wait(), 5)
    assert transport.received == [b"one"]  # the second chunk has not even been sent yet
    gate.set()
    await asyncio.wait_for(task, 5)
    assert transport.received == [b"one", b"two"]


@pytest.mark.anyio
async def test_streamed_body_over_the_limit_is_413() -> None:
    """A chunked upload that passes max_body_bytes gets 413, counted as the gateway's own."""

    class _Reader(_Transport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            assert isinstance(request.stream, httpx.AsyncByteStream)
            async for _ in request.stream:
                pass
            return httpx.Response(200)

    async def nobody() -> AsyncIterator[bytes]:
        yield b""

    gate = asyncio.Event()
    gate.set()
    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    app = ProxyApp("http://u.test", transport=_Reader(nobody),
                   config=ProxyConfig(max_body_bytes=5))  # fmt: skip
    scope = with_context(_scope("POST", [(b"transfer-encoding", b"chunked")]), ctx)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, _chunked_receive([b"abcd", b"efgh"], gate), send)
    assert sent[0]["status"] == 413
    assert ctx.outcome is AttemptOutcome.GATEWAY_ERROR


@pytest.mark.anyio
async def test_declared_length_over_the_limit_is_413_before_reading() -> None:
    """Content-Length above max_body_bytes: 413 at once, the body is never read."""

    async def receive() -> Message:
        raise AssertionError("the body must not be read")

    app = ProxyApp("http://u.test", transport=httpx.MockTransport(lambda r: httpx.Response(200)),
                   config=ProxyConfig(max_body_bytes=10))  # fmt: skip
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await app(_scope("POST", [(b"content-length", b"134217728")]), receive, send)
    assert sent[0]["status"] == 413
