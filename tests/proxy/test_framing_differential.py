"""Differential request-framing test (issue 27): one request in, at most one out, same body.

hypothesis writes hostile request bytes (Content-Length with Transfer-Encoding,
duplicate, signed, listed and huge lengths, Transfer-Encoding variants, chunk
extensions, ``Connection`` tokens naming framing headers, obs-fold, bare LF,
upgrades, a second request hidden in the body). Each goes on a raw socket to
the default gateway on uvicorn (guarded httptools protocol), once per
transport, in front of a recording upstream that parses what arrives with h11
as a server would.

The reference is the gateway's own front parser (``httptools``, what uvicorn
parses the client with): the requests the upstream receives must be, in
order, a subset of the requests the front parser found in the client's bytes,
each with the same method, target and body bytes; every forwarded head
carries exactly one ``Host`` and one framing header. So a body can never
become a request upstream, a request can never swallow the next one, and the
upstream never parses bytes it cannot frame. (The response half is in its
own module.)
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import h11
import httptools
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ballast_asgi.config import build_config
from ballast_asgi.config.models import ServerConfig
from ballast_asgi.gateway import build_gateway
from ballast_asgi.server.serve import uvicorn_settings
from tests.e2e.servers import serving

pytestmark = pytest.mark.e2e

TRANSPORTS = ("lean", "aiohttp", "httpx")
#: Each transport as configured by default, plus the lean default with every body streamed
#: upstream (``request_buffer_bytes: 0``: the streamed path, held to its declared length).
GATEWAYS: dict[str, dict[str, Any]] = {
    **{t: {"transport": t} for t in TRANSPORTS},
    "lean-streamed": {"transport": "lean", "request_buffer_bytes": 0},
}
#: Per transport; ``BALLAST_FRAMING_EXAMPLES=500`` for a deeper run (the default keeps the
#: module near 30 s on a loaded two-core machine).
EXAMPLES = int(os.environ.get("BALLAST_FRAMING_EXAMPLES", "40"))
#: Replaced per run by a 6-digit run number: every request names the run it belongs to.
RUN = b"QZQZQZ"
SMUGGLED = b"GET /smuggled-" + RUN + b" HTTP/1.1\r\nHost: evil\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True)
class Seen:
    """One complete request as h11 parsed it upstream."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass
class Upstream:
    """A loopback upstream that parses every connection with h11 (server side)."""

    requests: list[Seen] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    sock: socket.socket = field(default_factory=socket.socket)

    def start(self) -> int:
        """Listen on a free port; accept in a daemon thread."""
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()
        return int(self.sock.getsockname()[1])

    def stop(self) -> None:
        """Stop accepting."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        parser = h11.Connection(h11.SERVER)
        state: list[Any] = [None, b""]  # the request in progress and its body so far
        with conn, contextlib.suppress(OSError):
            conn.settimeout(30)
            while self._step(conn, parser, state):
                pass

    def _step(self, conn: socket.socket, parser: h11.Connection, state: list[Any]) -> bool:
        """Read once and handle every event; False when the connection is over."""
        data = conn.recv(65536)
        parser.receive_data(data)
        while True:
            try:
                event = parser.next_event()
            except h11.RemoteProtocolError as exc:
                if data:  # bytes the upstream cannot frame (a request cut by EOF is an abort)
                    with self.lock:
                        self.errors.append(f"{exc!r} after {data[-200:]!r}")
                return False
            if event is h11.NEED_DATA:
                return bool(data)
            if isinstance(event, h11.Request):
                state[:] = [event, b""]
            elif isinstance(event, h11.Data):
                state[1] += event.data
            elif isinstance(event, h11.EndOfMessage):
                self._done(conn, parser, state[0], state[1])
            else:  # ConnectionClosed, or PAUSED (not expected from a gateway)
                return False

    def _done(self, conn: socket.socket, parser: h11.Connection, request: Any, body: bytes) -> None:
        assert request is not None
        seen = Seen(request.method, request.target, list(request.headers.raw_items()), body)
        with self.lock:
            self.requests.append(seen)
        answer = [
            h11.Response(status_code=200, headers=[(b"content-length", b"2")]),
            h11.Data(data=b"ok"),
            h11.EndOfMessage(),
        ]
        conn.sendall(b"".join(parser.send(e) or b"" for e in answer))
        parser.start_next_cycle()

    def take(self) -> tuple[list[Seen], list[str]]:
        """Everything recorded since the last call."""
        with self.lock:
            requests, self.requests = self.requests, []
            errors, self.errors = self.errors, []
        return requests, errors


@pytest.fixture(scope="module")
def gateways() -> Iterator[tuple[Upstream, dict[str, int]]]:
    """The recording upstream and one default gateway per transport in front of it."""
    upstream = Upstream()
    port = upstream.start()
    ports: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        for name, proxy in GATEWAYS.items():
            config = build_config({"upstream": f"http://127.0.0.1:{port}", "proxy": proxy})
            app = build_gateway(config, env={})
            settings_ = uvicorn_settings(ServerConfig())
            ports[name] = stack.enter_context(serving(app, **settings_))
        yield upstream, ports
    upstream.stop()


# -- the reference: what the gateway's front parser finds in the client's bytes -----------


class _Reference:
    """httptools callbacks: the complete requests (method, target, body) in order."""

    def __init__(self) -> None:
        self.requests: list[tuple[bytes, bytes, bytes]] = []
        self._url = b""
        self._body = b""
        self.parser = httptools.HttpRequestParser(self)

    def on_message_begin(self) -> None:
        self._url, self._body = b"", b""

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.requests.append((self.parser.get_method(), self._url, self._body))


def reference(data: bytes) -> list[tuple[bytes, bytes, bytes]]:
    """The requests httptools (uvicorn's parser) finds, up to an error or a protocol switch."""
    ref = _Reference()
    with contextlib.suppress(httptools.HttpParserError, httptools.HttpParserUpgrade):
        ref.parser.feed_data(data)
    return ref.requests


# -- hostile requests --------------------------------------------------------------------

_RUNS = itertools.count(100_000)
TE_VALUES = [
    b"chunked", b"Chunked", b" chunked", b"chunked ", b"chunked, chunked", b"gzip, chunked",
    b"identity", b"identity, chunked", b"xchunked", b"chunked;q=1", b"\tchunked",
]  # fmt: skip
CONNECTION_TOKENS = [
    b"close", b"keep-alive", b"content-length", b"Content-Length", b"transfer-encoding",
    b"host", b"te", b"upgrade", b"x-priority", b"x-forwarded-for",
]  # fmt: skip


def _chunked(body: bytes, sizes: list[int], extension: bool) -> bytes:
    out, rest = b"", body
    for size in sizes:
        piece, rest = rest[:size], rest[size:]
        if piece:
            ext = b";ext=1" if extension else b""
            out += b"%x%s\r\n%s\r\n" % (len(piece), ext, piece)
    if rest:
        out += b"%x\r\n%s\r\n" % (len(rest), rest)
    return out + b"0\r\n\r\n"


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    """One client connection's bytes: a hostile head, its body, maybe more after it."""
    method = draw(st.sampled_from([b"POST", b"PUT", b"PATCH", b"GET", b"DELETE"]))
    body = draw(st.binary(max_size=120))
    if draw(st.booleans()):
        body = body[:20] + SMUGGLED + body[20:]
    chunked_body = _chunked(
        body, draw(st.lists(st.integers(1, 40), max_size=4)), draw(st.booleans())
    )
    fields: list[bytes] = [b"Host: gw"]
    if draw(st.integers(0, 9)) == 0:
        fields.append(b"Host: " + draw(st.sampled_from([b"gw", b"evil"])))
    tokens = draw(st.lists(st.sampled_from(CONNECTION_TOKENS), max_size=3))
    if draw(st.booleans()):  # half the heads name a framing header
        tokens.append(draw(st.sampled_from(CONNECTION_TOKENS[2:5])))
    if tokens:
        fields.append(b"Connection: " + b", ".join(tokens))
    if b"upgrade" in tokens or draw(st.integers(0, 9)) == 0:
        fields.append(b"Upgrade: " + draw(st.sampled_from([b"foo", b"h2c", b"websocket"])))
    framing = draw(st.sampled_from(["length", "chunked", "both", "none", "odd-length"]))
    payload = body
    if framing in ("length", "both"):
        fields.append(b"Content-Length: %d" % len(body if framing == "length" else chunked_body))
    if framing == "odd-length":
        value = draw(
            st.sampled_from(
                [b"0%d", b" %d ", b"+%d", b"%d, %d", b"-1", b"99999999999999999999", b"0x10"]
            )
        )
        fields.append(
            b"Content-Length: "
            + (value.replace(b"%d", b"%d") % ((len(body),) * value.count(b"%d")))
        )
        if draw(st.booleans()):
            fields.append(b"Content-Length: %d" % (len(body) + draw(st.integers(0, 1))))
    if framing in ("chunked", "both"):
        te = draw(st.sampled_from(TE_VALUES))
        if draw(st.integers(0, 4)) == 0:  # obs-fold
            fields.append(b"Transfer-Encoding:\r\n " + te.strip())
        else:
            fields.append(b"Transfer-Encoding: " + te)
        payload = chunked_body
    fields = draw(st.permutations(fields))
    eol = draw(st.sampled_from([b"\r\n", b"\r\n", b"\r\n", b"\n"]))
    head = eol.join([method + b" /e-" + RUN + b" HTTP/1.1", *fields, b"X-Tail: 1", b"", b""])
    return head + payload + draw(st.sampled_from([b"", SMUGGLED]))


def _exchange(port: int, data: bytes) -> None:
    """Send ``data``, then read until the gateway closes or goes quiet (bounded)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(data)
        sock.settimeout(0.5)
        with contextlib.suppress(OSError):
            while sock.recv(65536):
                pass


def _check(data: bytes, seen: list[Seen]) -> None:
    expected = reference(data)
    assert len(seen) <= len(expected), (seen, expected)
    remaining = iter(expected)
    for request in seen:
        target = (request.method, request.target, request.body)
        assert any(target == ref for ref in remaining), (request, expected)
        names = [name.lower() for name, _ in request.headers]
        assert names.count(b"host") == 1
        framing = names.count(b"content-length") + names.count(b"transfer-encoding")
        assert framing <= 1, request.headers
        assert framing == 1 or request.body == b""


class Runs:
    """Each run's bytes and the upstream requests that name it (late ones included)."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.seen: dict[bytes, list[Seen]] = {}

    def send(self, port: int, template: bytes) -> bytes:
        """Send ``template`` under a fresh run number; returns the number."""
        run = b"%06d" % next(_RUNS)
        self.data[run] = template.replace(RUN, run)
        _exchange(port, self.data[run])
        return run

    def check(self, upstream: Upstream, run: bytes) -> list[Seen]:
        """Attribute what the upstream got by run number; check every run concerned."""
        seen, errors = upstream.take()
        assert errors == [], errors  # the upstream could frame every byte it got
        touched = {run}
        for request in seen:
            owner = request.target[-6:]
            assert owner in self.data, request  # a target the gateway never received
            self.seen.setdefault(owner, []).append(request)
            touched.add(owner)
        for owner in touched:
            _check(self.data[owner], self.seen.get(owner, []))
        return self.seen.get(run, [])


@pytest.fixture(scope="module")
def runs() -> Runs:
    """The module's runs, so that a request arriving late is still checked against its own."""
    return Runs()


@pytest.mark.parametrize("transport", list(GATEWAYS))
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=hostile())
def test_one_request_in_at_most_one_out_with_the_same_body(
    gateways: tuple[Upstream, dict[str, int]], runs: Runs, transport: str, data: bytes
) -> None:
    """Whatever the client's framing, the upstream parses only requests the gateway received."""
    upstream, ports = gateways
    run = runs.send(ports[transport], data)
    seen = runs.check(upstream, run)
    event(f"front parser: {len(reference(runs.data[run]))} request(s), upstream: {len(seen)}")


@pytest.mark.parametrize("transport", list(GATEWAYS))
def test_the_issue_27_attack_is_one_request_upstream(
    gateways: tuple[Upstream, dict[str, int]], runs: Runs, transport: str
) -> None:
    """The exact attack of issue 27: one POST upstream whose body is the would-be request."""
    upstream, ports = gateways
    data = (
        b"POST /attack-" + RUN + b" HTTP/1.1\r\nHost: gw\r\nConnection: close, content-length\r\n"
        b"Content-Length: %d\r\n\r\n" % len(SMUGGLED)
    ) + SMUGGLED
    run = runs.send(ports[transport], data)
    seen = runs.check(upstream, run)
    assert [(r.target, r.body) for r in seen] == [(b"/attack-" + run, SMUGGLED.replace(RUN, run))]
