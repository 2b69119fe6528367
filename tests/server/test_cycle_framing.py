"""The guarded protocols' request cycle (``server/cycle.py``) writes what uvicorn's writes.

One ASGI app, served three times on real uvicorn servers: by uvicorn's own
httptools protocol (the reference), by ``GuardedHttpToolsProtocol`` and by
``WireShedProtocol`` (an app with a ``shed_at_wire`` that never sheds, so every
request goes the ASGI way through ``ResponseCycle``). Each case sends the same
raw bytes to the three and compares every byte that comes back, up to the
server's close: keep-alive, HTTP/1.0, ``Connection: close`` both ways, HEAD,
chunked and streamed responses, 204/304, ``Expect: 100-continue``, request
bodies (length and chunked), pipelining, responses over 64 KiB, and the app's
errors (bad header names and values, Content-Length too short or too long, an
exception, no response). Then what only one connection shows: a client that
disconnects mid-response and one that does not read (write backpressure).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from ballast_asgi.config.models import ServerConfig
from ballast_asgi.core.types import Receive, Scope, Send
from ballast_asgi.server.serve import guarded_protocol
from ballast_asgi.server.wire import WireShedProtocol
from tests.e2e.servers import serving

pytestmark = pytest.mark.e2e

BIG = bytes(range(256)) * 400  # 102,400 bytes: over the 64 KiB join limit
CHUNK = b"c" * 30_000
HUGE = 256 * 65536
#: What the app saw of the connections it served (disconnects, sends after them).
SEEN: dict[str, Any] = {}
#: Set by the app (server thread) when ``/slow`` has finished its stream.
SLOW_DONE = threading.Event()


async def _body(receive: Receive) -> bytes:
    data = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return data
        data += message.get("body", b"")
        if not message.get("more_body", False):
            return data


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers by path; every framing case the cycle handles."""
    if scope["type"] != "http":
        return
    path = scope["path"]

    async def start(status: int, headers: list[tuple[bytes, bytes]]) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(data: bytes, more: bool = False) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": more})

    if path == "/cl":
        await start(200, [(b"content-type", b"text/plain"), (b"content-length", b"2")])
        await body(b"ok")
    elif path == "/echo":
        data = await _body(receive)
        names = b",".join(name for name, _ in scope["headers"])
        await start(200, [(b"content-length", str(len(data)).encode()), (b"x-names", names)])
        await body(data)
    elif path == "/chunked":  # no length: uvicorn adds transfer-encoding
        await start(200, [(b"content-type", b"text/plain")])
        await body(b"one", True)
        await body(b"", True)
        await body(b"two", True)
        await body(b"")
    elif path == "/te":
        await start(200, [(b"Transfer-Encoding", b"chunked"), (b"content-length", b"5")])
        await body(b"abc", True)
        await body(b"de")
    elif path in ("/204", "/304"):
        await start(int(path[1:]), [(b"etag", b'"x"')])
        await body(b"")
    elif path == "/close":
        await start(200, [(b"content-length", b"2"), (b"Connection", b"keep-alive, Close")])
        await body(b"ok")
    elif path == "/big":
        await start(200, [(b"content-length", str(len(BIG)).encode())])
        await body(BIG)
    elif path == "/stream":
        await start(200, [(b"content-length", str(len(CHUNK) * 4).encode())])
        for i in range(4):
            await body(CHUNK, i < 3)
    elif path == "/bad-value":
        await start(200, [(b"content-length", b"2"), (b"x-a", b"1\r\nset-cookie: evil")])
    elif path == "/bad-name":
        await start(200, [(b"x-a", b"1"), (b"bad name", b"v"), (b"content-length", b"x")])
    elif path == "/bad-length":
        await start(200, [(b"content-length", b"two")])
    elif path == "/short":
        await start(200, [(b"content-length", b"10")])
        await body(b"ok")
    elif path == "/long":
        await start(200, [(b"content-length", b"1")])
        await body(b"ok")
    elif path == "/raise":
        raise RuntimeError("the app failed")
    elif path == "/nothing":
        return
    elif path == "/slow":
        await start(200, [(b"content-type", b"text/plain")])
        await body(b"first", True)
        await receive()  # the (empty) request body
        gone = await receive()  # returns once the client has closed: no timer involved
        assert gone == {"type": "http.disconnect"}
        for _ in range(200):  # sent into the void: dropped by the server
            await body(b"x" * 1000, True)
        await body(b"")
        SEEN["slow"] = await receive()
        SLOW_DONE.set()
    elif path == "/huge":  # 16 MiB: far more than the socket buffers hold
        await start(200, [(b"content-length", str(HUGE).encode())])
        for i in range(256):
            await body(bytes([i]) * 65536, i < 255)
        SEEN["huge"] = True


class WireApp:
    """``app`` with a wire decision that never sheds (every request the ASGI way)."""

    def shed_at_wire(self, *_: Any) -> None:
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await app(scope, receive, send)


SETTINGS = {"lifespan": "off", "access_log": False, "date_header": False, "server_header": True}


@contextmanager
def three() -> Iterator[list[int]]:
    """Ports of uvicorn's protocol, the guarded one and the wire one, serving ``app``."""
    with ExitStack() as stack:
        guarded = guarded_protocol(ServerConfig())
        wire = guarded_protocol(ServerConfig(), WireShedProtocol)
        yield [
            stack.enter_context(serving(app, http="httptools", **SETTINGS)),
            stack.enter_context(serving(app, http=guarded, **SETTINGS)),
            stack.enter_context(serving(WireApp(), http=wire, **SETTINGS)),
        ]


def read_to_close(sock: socket.socket) -> bytes:
    """Everything until the server closes (or resets) the connection."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        data += b"<reset>"
    return data


def exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a new connection; every byte until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        return read_to_close(sock)


def get(path: str, extra: bytes = b"", version: bytes = b"1.1", method: bytes = b"GET") -> bytes:
    return method + b" " + path.encode() + b" HTTP/" + version + b"\r\nHost: t\r\n" + extra


LAST = get("/cl", b"Connection: close\r\n\r\n")  # ends a keep-alive exchange with a close

CASES = {
    "keep-alive, then close": get("/cl", b"\r\n") + LAST,
    "http/1.0": get("/cl", b"\r\n", b"1.0"),
    "http/1.0 keep-alive asked": get("/cl", b"Connection: keep-alive\r\n\r\n", b"1.0"),
    "request connection close": get("/cl", b"Connection: close\r\n\r\n") + get("/cl", b"\r\n"),
    "response connection close": get("/close", b"\r\n") + get("/cl", b"\r\n"),
    "head": get("/cl", b"\r\n", method=b"HEAD") + get("/chunked", b"\r\n", method=b"HEAD") + LAST,
    "chunked response": get("/chunked", b"\r\n") + LAST,
    "given transfer-encoding": get("/te", b"\r\n") + LAST,
    "204 and 304": get("/204", b"\r\n") + get("/304", b"\r\n") + LAST,
    "over 64 KiB": get("/big", b"\r\n") + LAST,
    "streamed over 64 KiB": get("/stream", b"\r\n") + LAST,
    "pipelined": get("/cl", b"\r\n") + get("/echo", b"Content-Length: 3\r\n\r\nabc") + LAST,
    "expect 100-continue": get("/echo", b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n")
    + b"hi"
    + LAST,
    "chunked request": get("/echo", b"Transfer-Encoding: chunked\r\n\r\n")
    + b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    + LAST,
    "request body over 64 KiB": get("/echo", b"Content-Length: 102400\r\n\r\n") + BIG + LAST,
    "header value with CR LF": get("/cl", b"\r\n") + get("/bad-value", b"\r\n") + LAST,
    "bad header name before a bad length": get("/cl", b"\r\n") + get("/bad-name", b"\r\n"),
    "bad content-length": get("/cl", b"\r\n") + get("/bad-length", b"\r\n") + LAST,
    "body shorter than content-length": get("/short", b"\r\n") + LAST,
    "body longer than content-length": get("/long", b"\r\n") + LAST,
    "app raises": get("/raise", b"\r\n") + LAST,
    "app sends nothing": get("/nothing", b"\r\n") + LAST,
}


@pytest.fixture(scope="module")
def ports() -> Iterator[list[int]]:
    """The three servers, shared by the cases."""
    with three() as served:
        yield served


@pytest.mark.parametrize("name", list(CASES))
def test_the_same_bytes_as_uvicorns_cycle(ports: list[int], name: str) -> None:
    """Every byte up to the close, as uvicorn's own protocol writes it, on both of ours."""
    answers = [exchange(port, CASES[name]) for port in ports]
    assert answers[0].startswith(b"HTTP/1.1 "), answers[0][:200]
    assert answers[1] == answers[0]
    assert answers[2] == answers[0]


def test_trailers_never_reach_the_app_as_headers(ports: list[int]) -> None:
    """A chunked request's trailer field is not among the headers the app sees (ours; the
    gateway patches uvicorn's class for the same, ``proxy/server.py``)."""
    data = get("/echo", b"Transfer-Encoding: chunked\r\n\r\n") + b"1\r\na\r\n0\r\nX-T: 1\r\n\r\n"
    for port in ports[1:]:
        answer = exchange(port, data + LAST)
        assert b"x-names: host,transfer-encoding\r\n" in answer


def test_a_client_gone_mid_response_costs_nothing_more(ports: list[int]) -> None:
    """A client that closes mid-stream: the app's sends are dropped, its next receive is a
    disconnect, and the server serves the next connection."""
    for port in ports[1:]:
        SEEN.pop("slow", None)
        SLOW_DONE.clear()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(get("/slow", b"\r\n"))
            first = sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200 OK\r\n")
        assert SLOW_DONE.wait(10), "the app never finished"  # woken by the app, not a timer
        assert SEEN["slow"] == {"type": "http.disconnect"}
        assert exchange(port, LAST).endswith(b"\r\n\r\nok")


def test_a_client_that_does_not_read_gets_every_byte_in_order(ports: list[int]) -> None:
    """16 MiB to a client that waits before reading: backpressure holds the app, nothing
    is lost or reordered, the same bytes as uvicorn's."""
    answers = []
    for port in ports:
        SEEN.pop("huge", None)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(get("/huge", b"Connection: close\r\n\r\n"))
            time.sleep(0.2)  # not reading: the server's buffers fill (not a correctness wait)
            assert "huge" not in SEEN  # 16 MiB cannot have gone out: the app is held
            answers.append(read_to_close(sock))
    body = answers[0].partition(b"\r\n\r\n")[2]
    assert len(body) == HUGE
    assert body[65536 * 5] == 5 and body[-1] == 255
    assert answers[1] == answers[0] and answers[2] == answers[0]
