"""``ResponseCycle.send`` against uvicorn's ``RequestResponseCycle.send``, message by message.

Generated responses (header names in any case, framing headers that agree or
not, values with CR/LF, names with spaces, bad lengths, HEAD, 204/304, bodies
shorter or longer than declared, streamed or whole, a connection that is kept
alive or not) are sent through both cycles on fake transports (no sockets):
the same bytes, in the same order, the same exception (type and message) at
the same message, the same close and the same state after.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from ballast_asgi.server.cycle import ResponseCycle


class FakeTransport:
    """Records writes and the close."""

    def __init__(self) -> None:
        self.data = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.data += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class FakeProtocol:
    """What ``ResponseCycle`` reads of its protocol."""

    def __init__(self, transport: FakeTransport, defaults: list[tuple[bytes, bytes]]) -> None:
        self.transport = transport
        self.flow = FlowControl(transport)  # type: ignore[arg-type]
        self.loop = asyncio.get_running_loop()
        self.logger = logging.getLogger("test.cycle")
        self.access_log = False
        self.access_logger = self.logger
        self.server_state = type("State", (), {"default_headers": defaults})()
        self._writing: Any = None
        self.responses = 0

    def on_response_complete(self) -> None:
        self.responses += 1

    def _close_after_response(self) -> bool:
        return False


NAMES = [b"content-length", b"Content-Length", b"transfer-encoding", b"Transfer-Encoding",
         b"connection", b"Connection", b"content-type", b"x-a", b"bad name", b"x:y"]  # fmt: skip
VALUES = [b"2", b"0", b"5", b"x", b"-1", b" 2 ", b"chunked", b"CHUNKED", b"close",
          b"keep-alive, Close", b"upgrade", b"text/plain", b"a\r\nb", b"a\tb", b"\x00"]  # fmt: skip
header = st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES))
body = st.tuples(st.sampled_from([b"", b"o", b"ok", b"okay!", b"x" * 70_000]), st.booleans())


async def run(cls: str, case: dict[str, Any]) -> tuple[Any, ...]:
    """Send the case's messages through one cycle; what came out of it."""
    transport = FakeTransport()
    scope = {"method": case["method"], "http_version": "1.1"}
    messages: list[dict[str, Any]] = [
        {"type": "http.response.start", "status": case["status"], "headers": case["headers"]}
    ] + [{"type": "http.response.body", "body": b, "more_body": m} for b, m in case["bodies"]]
    if cls == "uvicorn":
        protocol = None
        cycle: Any = RequestResponseCycle(
            scope=scope,  # type: ignore[arg-type]
            transport=transport,  # type: ignore[arg-type]
            flow=FlowControl(transport),  # type: ignore[arg-type]
            logger=logging.getLogger("test.cycle"),
            access_logger=logging.getLogger("test.cycle"),
            access_log=False,
            default_headers=case["defaults"],
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=case["keep_alive"],
            on_response=lambda: None,
        )
    else:
        protocol = FakeProtocol(transport, case["defaults"])
        cycle = ResponseCycle(protocol, scope, case["keep_alive"], False)  # type: ignore[arg-type]
    error = None
    sent = 0
    for message in messages:
        try:
            await cycle.send(message)
        except Exception as exc:
            error = (type(exc), str(exc))
            break
        sent += 1
    if protocol is not None:
        cycle.flush()  # what the next loop turn writes
    state = (cycle.keep_alive, cycle.chunked_encoding, cycle.expected_content_length)
    return (transport.data, transport.closed, error, sent, cycle.response_complete, state)


@settings(max_examples=400, deadline=None)
@given(
    headers=st.lists(header, max_size=5),
    bodies=st.lists(body, min_size=1, max_size=3),
    method=st.sampled_from(["GET", "HEAD"]),
    status=st.sampled_from([200, 204, 304, 404]),
    keep_alive=st.booleans(),
    defaults=st.sampled_from([[], [(b"server", b"uvicorn")]]),
)
def test_the_same_bytes_errors_and_state_as_uvicorns_send(**case: Any) -> None:
    """Any response, sent message by message: what uvicorn's cycle writes and raises."""

    async def both() -> tuple[Any, Any]:
        return await run("uvicorn", case), await run("ours", case)

    theirs, ours = asyncio.run(both())
    assert ours == theirs


async def whole(way: str, case: dict[str, Any]) -> tuple[Any, ...]:
    """A head and one last body message through ``deliver`` twice, or ``deliver_whole``."""
    transport = FakeTransport()
    protocol = FakeProtocol(transport, case["defaults"])
    scope = {"method": case["method"], "http_version": "1.1"}
    cycle = ResponseCycle(protocol, scope, case["keep_alive"], False)  # type: ignore[arg-type]
    error = None
    try:
        if way == "whole":
            cycle.deliver_whole(case["status"], case["headers"], case["body"])
        else:
            cycle.deliver({"type": "http.response.start", "status": case["status"],
                           "headers": case["headers"]})  # fmt: skip
            cycle.deliver({"type": "http.response.body", "body": case["body"], "more_body": False})
    except Exception as exc:
        error = (type(exc), str(exc))
    cycle.flush()  # what the next loop turn writes
    state = (cycle.keep_alive, cycle.chunked_encoding, cycle.expected_content_length)
    return (transport.data, transport.closed, error, cycle.response_complete, state,
            protocol.responses, cycle.response_started)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    headers=st.lists(header, max_size=5),
    body=st.sampled_from([b"", b"o", b"ok", b"okay!", b"x" * 70_000]),
    method=st.sampled_from(["GET", "HEAD"]),
    status=st.sampled_from([200, 204, 304, 404]),
    keep_alive=st.booleans(),
    defaults=st.sampled_from([[], [(b"server", b"uvicorn")]]),
)
def test_deliver_whole_is_the_two_messages(**case: Any) -> None:
    """The lane's one-write answer: the bytes, errors and state of its two messages."""

    async def both() -> tuple[Any, Any]:
        return await whole("whole", case), await whole("messages", case)

    ours, theirs = asyncio.run(both())
    assert ours == theirs


RAW_NAMES = [b"Content-Type", b"X-A", b"x-b", b"Location", b"ETag", b"Set-Cookie", b"Vary",
             b"Connection", b"Keep-Alive", b"Transfer-Encoding", b"Proxy-X", b"Server"]  # fmt: skip
RAW_VALUES = [b"text/plain", b"a, b", b"\"etag\"", b"k=v; Path=/", b"close", b"chunked",
              b"x-a", b" padded ", b"", b"\xe9t\xe9", b"a\tb"]  # fmt: skip


def _relayed_head(raw: list[tuple[bytes, bytes]], body: bytes) -> Any:
    """``raw`` as an upstream's response parsed by the lean client and checked by
    ``response_head`` (what the lane relays), or None when either refuses it."""
    from ballast_asgi.proxy.headers import BadResponseHead, response_head
    from ballast_asgi.proxy.transports.lean_wire import LeanResponse

    class Conn:
        loop = asyncio.get_running_loop()
        exchange = None
        paused = closed = False

        def arm(self, at: float) -> None: ...

        def release(self, conn: Any, reuse: bool) -> None: ...

    fields = b"".join(n + b": " + v + b"\r\n" for n, v in raw)
    wire = b"HTTP/1.1 200 OK\r\n" + fields + b"Content-Length: %d\r\n\r\n" % len(body) + body
    response = LeanResponse(Conn(), False, 8190, None, None)  # type: ignore[arg-type]
    response.feed(wire)
    if not response.final or response._error is not None:
        return None
    try:
        headers, length, _ = response_head(200, response.raw_headers, 100, 65536, False)
    except BadResponseHead:
        return None
    return headers if length == len(body) else None


async def relayed(way: str, case: dict[str, Any]) -> tuple[Any, ...] | None:
    """The lane's answer through ``deliver_relayed`` or ``deliver_whole``."""
    headers = _relayed_head(case["raw"], case["body"])
    if headers is None:
        return None
    transport = FakeTransport()
    protocol = FakeProtocol(transport, case["defaults"])
    scope = {"method": case["method"], "http_version": "1.1"}
    cycle = ResponseCycle(protocol, scope, case["keep_alive"], False)  # type: ignore[arg-type]
    if way == "relayed":
        cycle.deliver_relayed(200, headers, case["body"])
    else:
        cycle.deliver_whole(200, headers, case["body"])
    cycle.flush()
    state = (cycle.keep_alive, cycle.chunked_encoding, cycle.expected_content_length)
    return (transport.data, transport.closed, cycle.response_complete, state,
            protocol.responses)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    raw=st.lists(st.tuples(st.sampled_from(RAW_NAMES), st.sampled_from(RAW_VALUES)), max_size=6),
    body=st.sampled_from([b"o", b"okay!", b"x" * 16_384]),
    method=st.sampled_from(["GET", "GET", "HEAD"]),
    keep_alive=st.booleans(),
    defaults=st.sampled_from([[], [], [(b"server", b"uvicorn")]]),
)
def test_deliver_relayed_writes_what_deliver_whole_writes(**case: Any) -> None:
    """Any upstream head the lean client and ``response_head`` let through: the lane's
    joined head is the bytes (and state) of uvicorn's header loop."""

    async def both() -> tuple[Any, Any]:
        return await relayed("relayed", case), await relayed("whole", case)

    ours, theirs = asyncio.run(both())
    assert ours == theirs
