"""Odd upstream answers on real uvicorn, every transport: 502 or a clean relay, and the
client's keep-alive connection (a pipelined second request on it) survives each one.

Issue 27 item 7, response side: a 204/304 with a Content-Length, statuses outside
200-599, an unasked 101, a transfer coding other than ``chunked``, CL with TE and
a head of thousands of fields. Before the fix uvicorn raised (204/304, 999, 600,
aiohttp's 099 and 101) and cut the client connection with the pipelined request
on it, or the gateway relayed the head (2,000 fields, ``chunked, gzip`` as identity).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from ballast_asgi.config import ProxyConfig
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import Message
from ballast_asgi.middleware.context import RequestContext, with_context
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.transports import make_transport
from ballast_asgi.telemetry.metrics import Metrics
from tests.e2e.hostile_response import GOOD_BODY, HostileUpstream, pipelined
from tests.e2e.support import thread_servers
from tests.lean_support import answering, raw_upstream

pytestmark = pytest.mark.e2e

TRANSPORTS = ["lean", "aiohttp", "httpx"]
OK = b"Content-Length: 2\r\n\r\nok"
MANY = b"".join(b"X-%d: v\r\n" % i for i in range(2_000))

#: name -> upstream answer that must become a 502 (the upstream connection is closed).
REFUSED = {
    "status-999": b"HTTP/1.1 999 Odd\r\n" + OK,
    "status-600": b"HTTP/1.1 600 Odd\r\n" + OK,
    "status-099": b"HTTP/1.1 099 Odd\r\n" + OK,
    "unasked-101": b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
    "chunked-gzip": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"
    b"2\r\nok\r\n0\r\n\r\n",
    "gzip-coding": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nConnection: close\r\n\r\nokok",
    "cl-and-te": b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"2\r\nok\r\n0\r\n\r\n",
    "2000-fields": b"HTTP/1.1 200 OK\r\n" + MANY + OK,
    "control-in-value": b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\n" + OK,
    "del-in-value": b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\n" + OK,
    "65-kib-head": b"HTTP/1.1 200 OK\r\n" + b"X-A: " + b"a" * 40_000 + b"\r\nX-B: "
    + b"b" * 30_000 + b"\r\n" + OK,
}  # fmt: skip


@pytest.fixture(scope="module")
def gateways() -> Iterator[tuple[HostileUpstream, dict[str, int]]]:
    """One hostile upstream and a uvicorn gateway per transport in front of it."""
    up = HostileUpstream().start()
    with thread_servers() as start:
        ports = {}
        for transport in TRANSPORTS:
            config = ProxyConfig.model_validate({"transport": transport, "timeout_ms": 5_000})
            ports[transport] = start(ProxyApp(f"http://127.0.0.1:{up.port}", config=config))
        yield up, ports
    up.stop()


def _second_is_good(exchange: Any) -> None:
    assert not exchange.malformed and not exchange.cut, exchange
    assert exchange.second is not None and exchange.second.complete
    assert (exchange.second.status, exchange.second.body) == (200, GOOD_BODY)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_an_answer_the_gateway_cannot_relay_is_a_502_and_the_connection_lives(
    gateways: Any, transport: str, name: str
) -> None:
    """Odd status, unasked 101, unknown coding, CL+TE, huge head: 502, then the next request."""
    up, ports = gateways
    # the upstream keeps the connection unless the answer is close-delimited: a well-framed
    # answer may leave a pooled connection (its bytes were read), which must then still work
    path = up.answer(uuid.uuid4().hex, REFUSED[name], close=b"close" in REFUSED[name])
    exchange = pipelined(ports[transport], path)
    assert exchange.first.complete and exchange.first.status == 502, exchange
    assert b"bad_gateway" in exchange.first.body
    _second_is_good(exchange)


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("status", [204, 304])
def test_no_content_with_a_length_keeps_the_client_connection(
    gateways: Any, transport: str, status: int
) -> None:
    """204/304 + Content-Length 5 (the upstream kept alive): relayed without body or length."""
    up, ports = gateways
    answer = b'HTTP/1.1 %d X\r\nContent-Length: 5\r\nETag: "v"\r\n\r\n' % status
    path = up.answer(uuid.uuid4().hex, answer, close=False)
    exchange = pipelined(ports[transport], path)
    first = exchange.first
    assert first.complete and (first.status, first.body) == (status, b""), exchange
    assert first.header(b"etag") == [b'"v"'] and first.header(b"content-length") == []
    _second_is_good(exchange)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_head_request_keeps_the_representation_length(gateways: Any, transport: str) -> None:
    """HEAD answered with Content-Length 5 and no body: the length is relayed, no body waited."""
    up, ports = gateways
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    path = up.answer(uuid.uuid4().hex, answer, close=False)
    exchange = pipelined(ports[transport], path, method="HEAD")
    assert exchange.first.complete and exchange.first.header(b"content-length") == [b"5"]
    _second_is_good(exchange)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_interim_responses_are_skipped(gateways: Any, transport: str) -> None:
    """100, 103 and an unregistered 150 before the final answer: the client gets the final one."""
    up, ports = gateways
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    answer = interim + b"HTTP/1.1 150 Odd\r\n\r\nHTTP/1.1 200 OK\r\n" + OK
    path = up.answer(uuid.uuid4().hex, answer, close=False)
    exchange = pipelined(ports[transport], path)
    assert exchange.first.complete and (exchange.first.status, exchange.first.body) == (200, b"ok")
    _second_is_good(exchange)


@pytest.mark.anyio
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_refused_head_is_a_protocol_error_outcome(transport: str) -> None:
    """A refused head is recorded as PROTOCOL_ERROR and counted as kind="protocol"."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    metrics = Metrics()
    async with raw_upstream(answering(REFUSED["status-999"])) as (_raw, up):
        config = ProxyConfig.model_validate({"transport": transport})
        proxy = ProxyApp(up, config=config, transport=make_transport(config), metrics=metrics)
        ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
        scope = with_context({"type": "http", "method": "GET", "path": "/", "raw_path": b"/",
                              "query_string": b"", "headers": []}, ctx)  # fmt: skip
        await asyncio.wait_for(proxy(scope, receive, send), 10)
        await proxy.aclose()
    assert sent[0]["status"] == 502
    assert ctx.outcome is AttemptOutcome.PROTOCOL_ERROR
    assert metrics.upstream_errors.labels("protocol")._value.get() == 1


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_head_limits_are_configurable(transport: str) -> None:
    """``proxy.max_response_headers`` raised to 3,000 lets the 2,000-field head through."""
    up = HostileUpstream().start()
    try:
        with thread_servers() as start:
            config = ProxyConfig.model_validate(
                {"transport": transport, "max_response_headers": 3_000,
                 "max_response_head_bytes": 256 * 1024}
            )  # fmt: skip
            port = start(ProxyApp(f"http://127.0.0.1:{up.port}", config=config))
            path = up.answer("many", b"HTTP/1.1 200 OK\r\n" + MANY + OK, close=False)
            exchange = pipelined(port, path)
    finally:
        up.stop()
    assert (exchange.first.status, exchange.first.body) == (200, b"ok")
    assert len(exchange.first.header(b"x-1999")) == 1
    _second_is_good(exchange)


SMUGGLED = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil"


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize(
    "answer",
    [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
     b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
     b"HTTP/1.1 204 No Content\r\n\r\n", b"HTTP/1.1 304 Not Modified\r\n\r\n"],
    ids=["length", "chunked", "204", "304"],
)  # fmt: skip
def test_bytes_after_a_response_never_answer_the_next_request(
    transport: str, answer: bytes
) -> None:
    """A response followed by a smuggled one on a kept-alive connection: the pooled connection
    is never reused with those bytes (httpx's pool answered the next request with them)."""
    up = HostileUpstream().start()
    try:
        with thread_servers() as start:
            config = ProxyConfig.model_validate({"transport": transport})
            port = start(ProxyApp(f"http://127.0.0.1:{up.port}", config=config))
            for round_ in range(3):
                path = up.answer(f"r{round_}", answer + SMUGGLED, close=False)
                exchange = pipelined(port, path)
                assert exchange.first.complete and exchange.first.body in (b"ok", b""), exchange
                _second_is_good(exchange)
    finally:
        up.stop()


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("status", [b"101", b"099", b"999"])
def test_a_connection_that_carried_a_refused_status_is_never_reused(
    transport: str, status: bytes
) -> None:
    """After an unasked 101 (or 099, 999) the upstream connection is closed, not pooled:
    aiohttp pooled it and bytes the upstream sent later answered the next request."""
    up = HostileUpstream().start()
    try:
        with thread_servers() as start:
            config = ProxyConfig.model_validate({"transport": transport})
            port = start(ProxyApp(f"http://127.0.0.1:{up.port}", config=config))
            for round_ in range(3):
                answer = b"HTTP/1.1 " + status + b" Odd\r\nContent-Length: 0\r\n\r\n"
                path = up.answer(f"r{round_}", answer, close=False)
                exchange = pipelined(port, path)
                assert exchange.first.status == 502, exchange
                _second_is_good(exchange)
    finally:
        up.stop()
    for paths in up.served:  # no connection carried a request after a refused answer
        refused = [i for i, p in enumerate(paths) if p.startswith("/h/")]
        assert all(i == len(paths) - 1 for i in refused), up.served
