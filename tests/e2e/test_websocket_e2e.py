"""WebSockets through a real gateway: echo both ways, close codes, admission at the upgrade,
the per-connection limits (idle, message size, buffered bytes, send timeouts)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from ballast_asgi.config import build_config
from ballast_asgi.gateway import build_gateway
from tests.e2e.support import (
    NO_BALLAST_ENV,
    free_port,
    no_drain,
    serve_in_thread,
    stop_process,
    stop_thread,
    wait_http,
)

pytestmark = pytest.mark.e2e


class Echo:
    """A websocket upstream: echoes frames, closes on ``close:CODE``, records the client close."""

    def __init__(self) -> None:
        self.disconnects: list[int] = []
        self.headers: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        self.headers.append(dict(scope["headers"]))
        await receive()
        offered = scope.get("subprotocols") or []
        await send({"type": "websocket.accept", "subprotocol": offered[0] if offered else None})
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                self.disconnects.append(message["code"])
                return
            text = message.get("text")
            if text and text.startswith("close:"):
                await send({"type": "websocket.close", "code": int(text[6:]), "reason": "bye"})
                continue
            key = "text" if text is not None else "bytes"
            await send({"type": "websocket.send", key: message.get(key)})


@pytest.fixture
def echo() -> Iterator[tuple[Echo, str]]:
    """The echo upstream on loopback."""
    app, port = Echo(), free_port()
    server, thread = serve_in_thread(app, port)
    yield app, f"http://127.0.0.1:{port}"
    stop_thread(server, thread)


@contextmanager
def gateway(upstream: str, **data: Any) -> Iterator[tuple[int, Any]]:
    """A gateway object served by uvicorn in a thread: (port, gateway)."""
    gw = build_gateway(build_config({"upstream": upstream, **data}), env={})
    port = free_port()
    server, thread = serve_in_thread(gw, port)
    try:
        yield port, gw
    finally:
        stop_thread(server, thread)


def test_echo_both_ways_with_subprotocol(echo: tuple[Echo, str]) -> None:
    """Text and binary frames go both ways; the upstream's subprotocol choice comes back."""
    app, upstream = echo
    with gateway(upstream) as (port, gw):
        url = f"ws://127.0.0.1:{port}/chat?room=1"
        with connect(url, subprotocols=["v2.chat"], additional_headers={"X-Trace": "abc"}) as ws:
            assert ws.subprotocol == "v2.chat"
            ws.send("hello")
            assert ws.recv(timeout=5) == "hello"
            ws.send(b"\x00\xffbin")
            assert ws.recv(timeout=5) == b"\x00\xffbin"
            assert gw.websockets.cap.open == 1
            assert gw.parts.limiter.inflight == 0
    assert app.headers[0][b"x-trace"] == b"abc"
    assert app.headers[0][b"x-forwarded-for"] == b"127.0.0.1"


def test_upstream_close_code_and_reason_reach_the_client(echo: tuple[Echo, str]) -> None:
    """The upstream closes with 4001 'bye': the client sees exactly that."""
    with gateway(echo[1]) as (port, gw), connect(f"ws://127.0.0.1:{port}/") as ws:
        ws.send("close:4001")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "bye")
    assert gw.websockets.cap.open == 0


def test_client_close_code_reaches_the_upstream(echo: tuple[Echo, str]) -> None:
    """The client closes with 4002: the upstream receives 4002."""
    app, upstream = echo
    with gateway(upstream) as (port, gw):
        with connect(f"ws://127.0.0.1:{port}/") as ws:
            ws.send("x")
            assert ws.recv(timeout=5) == "x"
            ws.close(4002, "done")
        limit = 200
        while (not app.disconnects or gw.websockets.cap.open) and limit:  # bounded poll
            limit -= 1
            httpx.get(f"http://127.0.0.1:{port}/_ballast/health")
        assert gw.websockets.cap.open == 0
    assert app.disconnects == [4002]


def test_cap_sheds_lower_tiers_first(echo: tuple[Echo, str]) -> None:
    """max_connections 2 with half reserved: one standard upgrade, a second gets 429."""
    ws_config = {"max_connections": 2, "reserved_fraction": 0.5}
    with gateway(echo[1], websocket=ws_config) as (port, gw):
        url = f"ws://127.0.0.1:{port}/"
        with connect(url) as first:
            with pytest.raises(InvalidStatus) as refused:
                connect(url)
            response = refused.value.response
            assert response.status_code == 429
            assert response.headers["x-ballast-reason"] == "capacity"
            with connect(url, additional_headers={"X-Priority": "critical"}) as vip:
                vip.send("still")
                assert vip.recv(timeout=5) == "still"
            first.send("ok")
            assert first.recv(timeout=5) == "ok"
        text = httpx.get(f"http://127.0.0.1:{port}/_ballast/metrics").text
    assert 'ballast_shed_total{priority="standard",reason="capacity"} 1.0' in text
    assert gw.websockets.cap.open == 0


def test_bad_priority_is_400_and_dead_upstream_is_502() -> None:
    """A malformed X-Priority is a 400 naming it; an unreachable upstream is a 502."""
    with gateway(f"http://127.0.0.1:{free_port()}") as (port, gw):
        url = f"ws://127.0.0.1:{port}/"
        with pytest.raises(InvalidStatus) as bad:
            connect(url, additional_headers={"X-Priority": "urgent!"})
        assert bad.value.response.status_code == 400
        assert b"x-priority" in bad.value.response.body.lower()
        with pytest.raises(InvalidStatus) as down:
            connect(url)
        assert down.value.response.status_code == 502
        assert gw.websockets.cap.open == 0


def test_a_duplicate_host_on_an_upgrade_is_400(echo: tuple[Echo, str]) -> None:
    """Two Host fields on an upgrade are refused as on HTTP (one head parser for both)."""
    _, upstream = echo
    with gateway(upstream) as (port, gw):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            key = base64.b64encode(os.urandom(16)).decode()
            sock.sendall(
                f"GET / HTTP/1.1\r\nHost: gw\r\nHost: evil\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                f"Sec-WebSocket-Version: 13\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                head += chunk
        assert head.startswith(b"HTTP/1.1 400"), head
        assert gw.websockets.cap.open == 0


def test_turned_off_is_403_with_one_log_line(
    echo: tuple[Echo, str], caplog: pytest.LogCaptureFixture
) -> None:
    """websocket.enabled false: 403 and one warning per refused upgrade; echo never called."""
    app, upstream = echo
    with (
        caplog.at_level(logging.WARNING, logger="ballast.websocket"),
        gateway(upstream, websocket={"enabled": False}) as (port, _),
    ):
        with pytest.raises(InvalidStatus) as refused:
            connect(f"ws://127.0.0.1:{port}/x")
        assert refused.value.response.status_code == 403
    lines = [r for r in caplog.records if r.name == "ballast.websocket"]
    assert len(lines) == 1 and "/x" in lines[0].getMessage()
    assert app.headers == []


def test_echo_through_the_cli(echo: tuple[Echo, str], tmp_path: Path) -> None:
    """The `ballast` CLI proxies a websocket echo too."""
    port = free_port()
    env = {**os.environ, **NO_BALLAST_ENV, "BALLAST_CONFIG": str(no_drain(tmp_path))}
    args = [sys.executable, "-m", "ballast_asgi", "--upstream", echo[1], "--port", str(port),
            "--admin-port", "0"]  # fmt: skip
    proc = subprocess.Popen(args, env=env, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        with connect(f"ws://127.0.0.1:{port}/") as ws:
            ws.send("via cli")
            assert ws.recv(timeout=5) == "via cli"
    finally:
        stop_process(proc)


def test_pooled_upgrades_settle_at_the_handshake_and_eject_a_dead_instance(
    echo: tuple[Echo, str],
) -> None:
    """An open websocket holds no instance lease; failed handshakes count against the instance."""
    dead = f"http://127.0.0.1:{free_port()}"
    with gateway([echo[1], dead], upstreams={"health_check": {"enabled": False}}) as (port, gw):
        selector = gw.pool.selector
        url = f"ws://127.0.0.1:{port}/"
        codes = []
        for _ in range(30):
            try:
                with connect(url) as ws:
                    ws.send("hi")
                    assert ws.recv(timeout=5) == "hi"
                    assert selector.open_leases() == 0  # settled at the handshake
                    codes.append(101)
            except InvalidStatus as exc:
                codes.append(exc.response.status_code)
        dead_state = next(u for u in gw.pool.snapshot() if u["url"] == dead)
    assert set(codes) <= {101, 502} and 0 < codes.count(502) <= 5
    assert codes[-10:] == [101] * 10  # ejected after its consecutive failures
    assert dead_state["ejected"] and dead_state["ejections"] == 1
    assert dead_state["failures"] == codes.count(502)
    assert selector.reaped == 0 and selector.open_leases() == 0


def _shed_headers(headers: Any) -> dict[str, str]:
    """The shed-specific headers of a refusal (what HTTP and websocket sheds share)."""
    names = ("retry-after", "x-ballast-reason", "ratelimit-policy", "ratelimit", "content-type")
    return {n: headers[n] for n in names if n in headers}


def test_rate_limit_applies_at_the_upgrade_with_the_http_shed_answer(
    echo: tuple[Echo, str],
) -> None:
    """At 1/s burst 1 the second upgrade gets the 429 an HTTP request gets, same headers;
    the admitted one's 101 carries the RateLimit headers as an admitted response does."""
    limit = {"enabled": True, "rate_per_s": 1, "burst": 1}
    with gateway(echo[1], rate_limit=limit) as (port, gw):
        url = f"ws://127.0.0.1:{port}/chat"
        with connect(url) as ws:
            ws.send("in")
            assert ws.recv(timeout=5) == "in"
            assert ws.response is not None
            admitted = ws.response.headers
        with pytest.raises(InvalidStatus) as refused:
            connect(url)
        http = httpx.get(f"http://127.0.0.1:{port}/chat")
        assert gw.websockets.cap.open == 0
    response = refused.value.response
    assert (response.status_code, http.status_code) == (429, 429)
    ws_headers = _shed_headers(response.headers)
    assert ws_headers["x-ballast-reason"] == "rate_limited"
    assert int(ws_headers["retry-after"]) >= 1
    assert ws_headers.keys() == _shed_headers(http.headers).keys()
    assert bytes(response.body).startswith(b'{"error":"shed","reason":"rate_limited"')
    assert admitted["ratelimit-policy"] == ws_headers["ratelimit-policy"]  # on the 101 too


def test_a_spent_deadline_is_shed_at_the_upgrade(echo: tuple[Echo, str]) -> None:
    """X-Deadline-Ms: 0 is dead on arrival: the HTTP shed answer, counted, no upstream call."""
    app, upstream = echo
    with gateway(upstream) as (port, _):
        with pytest.raises(InvalidStatus) as refused:
            connect(f"ws://127.0.0.1:{port}/", additional_headers={"X-Deadline-Ms": "0"})
        text = httpx.get(f"http://127.0.0.1:{port}/_ballast/metrics").text
    response = refused.value.response
    assert response.headers["x-ballast-reason"] == "deadline"
    body = json.loads(bytes(response.body))  # the JSON of an HTTP shed
    assert body == {"error": "shed", "reason": "deadline", "priority": "standard",
                    "retry_after_s": int(response.headers["retry-after"])}  # fmt: skip
    assert 'ballast_shed_total{priority="standard",reason="deadline"} 1.0' in text
    assert app.headers == []


def test_one_client_address_cannot_hold_every_slot(echo: tuple[Echo, str]) -> None:
    """Two per client: a third upgrade from 127.0.0.1 is shed; a client behind a trusted
    proxy (its own address from X-Forwarded-For) still gets a slot."""
    config = {"websocket": {"max_connections_per_client": 2},
              "proxy": {"trusted_proxies": ["127.0.0.1/32"]}}  # fmt: skip
    with gateway(echo[1], **config) as (port, gw):
        url = f"ws://127.0.0.1:{port}/"
        with connect(url), connect(url):
            with pytest.raises(InvalidStatus) as refused:
                connect(url)
            other = {"X-Forwarded-For": "203.0.113.9"}
            with connect(url, additional_headers=other) as ws:
                ws.send("mine")
                assert ws.recv(timeout=5) == "mine"
                snap = httpx.get(f"http://127.0.0.1:{port}/_ballast/snapshot").json()
    assert refused.value.response.status_code == 429
    assert refused.value.response.headers["x-ballast-reason"] == "capacity"
    assert snap["websocket"]["open"] == 3 and snap["websocket"]["busiest_client"] == 2
    assert gw.websockets.cap.by_client == {}


def test_dry_run_counts_an_upgrade_over_the_client_cap_and_lets_it_through(
    echo: tuple[Echo, str],
) -> None:
    """load_shed_dry_run: the second upgrade from one client (cap 1) is relayed and counted
    as a would-be capacity shed; it holds no slot."""
    data = {"load_shed_dry_run": True, "websocket": {"max_connections_per_client": 1}}
    with gateway(echo[1], **data) as (port, gw):
        url = f"ws://127.0.0.1:{port}/"
        with connect(url), connect(url) as second:
            second.send("through")
            assert second.recv(timeout=5) == "through"
            assert gw.websockets.cap.open == 1
        text = httpx.get(f"http://127.0.0.1:{port}/_ballast/metrics").text
        _settle(port, gw)
    assert 'ballast_dry_run_shed_total{priority="standard",reason="capacity"} 1.0' in text


def test_an_idle_connection_is_closed_with_1001(echo: tuple[Echo, str]) -> None:
    """idle_timeout_ms 200: a connection with no traffic is closed on both sides with 1001."""
    app, upstream = echo
    with gateway(upstream, websocket={"idle_timeout_ms": 200}) as (port, gw):
        with connect(f"ws://127.0.0.1:{port}/") as ws, pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        _settle(port, gw)
    assert closed.value.rcvd is not None
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "idle timeout")
    assert app.disconnects == [1001]


def test_a_client_message_over_max_message_bytes_is_closed_with_1009(
    echo: tuple[Echo, str],
) -> None:
    """max_message_bytes 1024 (uvicorn left at 16 MiB): a 2000-byte message closes with 1009."""
    app, upstream = echo
    with gateway(upstream, websocket={"max_message_bytes": 1024}) as (port, gw):
        with connect(f"ws://127.0.0.1:{port}/") as ws, pytest.raises(ConnectionClosed) as closed:
            ws.send(b"x" * 2000)
            ws.recv(timeout=10)
        _settle(port, gw)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    assert app.disconnects == [1001]


def _settle(port: int, gw: Any, polls: int = 300) -> None:
    """Poll the gateway (bounded) until no websocket is open."""
    while gw.websockets.cap.open and polls:
        polls -= 1
        httpx.get(f"http://127.0.0.1:{port}/_ballast/health")
    assert gw.websockets.cap.open == 0


class Stall:
    """A websocket upstream that accepts and then never reads (until ``release``)."""

    def __init__(self) -> None:
        self.waiting: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        event = asyncio.Event()
        self.waiting.append((asyncio.get_running_loop(), event))
        await event.wait()

    def release(self) -> None:
        for loop, event in self.waiting:
            loop.call_soon_threadsafe(event.set)


def _raw_upgrade(port: int) -> socket.socket:
    """A raw socket with a completed websocket upgrade to ``/``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall(
        f"GET / HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def _push_until_blocked(sock: socket.socket, message: bytes, cap_bytes: int) -> int:
    """Send masked binary frames of ``message`` until the peer stops reading; bytes sent."""
    frame = struct.pack("!BBQ", 0x82, 0x80 | 127, len(message)) + b"\x00" * 4 + message
    sock.settimeout(0.5)
    sent = 0
    view = memoryview(frame * 4)
    while sent < cap_bytes:
        try:
            sent += sock.send(view[sent % len(view) :])
        except TimeoutError:
            return sent  # the gateway stopped reading
    raise AssertionError(f"the gateway read {sent} bytes without pushing back")


def test_a_stalled_upstream_and_a_vanished_client_free_the_slot_and_the_bytes() -> None:
    """A client fills a connection to an upstream that stopped reading, then resets TCP:
    the bytes held are bounded and counted, and the send timeout frees slot and bytes."""
    stall, up = Stall(), free_port()
    server, thread = serve_in_thread(stall, up)
    limits = {"buffer_bytes": 65_536, "max_message_bytes": 262_144, "send_timeout_ms": 3_000,
              "max_bytes_per_s": 2**34, "max_messages_per_s": 1_000_000}  # fmt: skip
    try:
        with gateway(f"http://127.0.0.1:{up}", websocket=limits) as (port, gw):
            sock = _raw_upgrade(port)
            _push_until_blocked(sock, b"\x00" * 262_144, 512 * 1024 * 1024)
            during = httpx.get(f"http://127.0.0.1:{port}/_ballast/snapshot").json()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
            _settle(port, gw, polls=3_000)
            after = httpx.get(f"http://127.0.0.1:{port}/_ballast/snapshot").json()
            text = httpx.get(f"http://127.0.0.1:{port}/_ballast/metrics").text
    finally:
        stall.release()
        stop_thread(server, thread)
    held = during["websocket"]["buffered_bytes"]
    assert 65_536 <= held <= 65_536 + 262_144  # the soft limit plus one message
    assert during["capacity"]["buffered_bytes"] >= held  # counted in the gateway's budget
    assert after["websocket"]["buffered_bytes"] == 0 == after["capacity"]["buffered_bytes"]
    assert after["websocket"]["open"] == 0
    assert 'ballast_websocket_closed_total{reason="upstream_send_timeout"} 1.0' in text
