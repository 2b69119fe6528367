"""The two Python floors of the headroom table (``experiments/bench/floors.py``) on loopback."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from experiments.bench import floors
from experiments.bench.headroom import FLOORS, floors_text, summarize

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class _Backend:
    """A keep-alive upstream answering 1 KB (Content-Length) with a hop-by-hop header."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.handle, floors.HOST, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        try:
            while True:
                await _answer(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
            await writer.wait_closed()


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer one request (its request line and Host echoed in ``x-seen``)."""
    head = await reader.readuntil(b"\r\n\r\n")
    seen = head.split(b"\r\n")[0] + b"|" + head.split(b"\r\nhost: ")[1].split(b"\r\n")[0]
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\nkeep-alive: timeout=5\r\n"
                 b"x-seen: %s\r\n\r\n%s" % (1024, seen, b"x" * 1024))  # fmt: skip
    await writer.drain()


async def _get(port: int, n: int, method: bytes = b"GET") -> list[bytes]:
    reader, writer = await asyncio.open_connection(floors.HOST, port)
    answers = []
    for i in range(n):
        writer.write(method + b" /x?i=%d HTTP/1.1\r\nhost: client\r\nx-a: 1\r\n\r\n" % i)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
        body = b"" if method == b"HEAD" else await reader.readexactly(length)
        answers.append(head + body)
    writer.close()
    await writer.wait_closed()
    return answers


async def test_raw_floor_forwards_on_one_keep_alive_connection() -> None:
    """The raw proxy relays each request (upstream host, hop-by-hop dropped, length kept)."""
    backend = _Backend()
    up_port = await backend.start()
    server = await asyncio.get_running_loop().create_server(
        lambda: floors.RawProxy(up_port), floors.HOST, 0
    )
    port = server.sockets[0].getsockname()[1]
    try:
        answers = await _get(port, 3)
        head_only = await _get(port, 1, b"HEAD")
    finally:
        server.close()
        await server.wait_closed()
        await backend.stop()
    for i, answer in enumerate(answers):
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"x" * 1024)
        assert b"x-seen: GET /x?i=%d HTTP/1.1|127.0.0.1:%d" % (i, up_port) in answer
        assert b"keep-alive" not in answer and b"content-length: 1024\r\n" in answer
    assert head_only[0].endswith(b"content-length: 1024\r\n\r\n")


async def test_asgi_floor_forwards_through_its_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The raw ASGI proxy app relays status, headers and body and reuses its connection."""
    backend = _Backend()
    up_port = await backend.start()
    monkeypatch.setitem(os.environ, "UPSTREAM_PORT", str(up_port))
    monkeypatch.setattr(floors, "_POOL", {})
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "raw_path": b"/y", "query_string": b"",
             "headers": [(b"host", b"client"), (b"connection", b"keep-alive")]}  # fmt: skip
    try:
        for _ in range(2):
            await floors.asgi_app(scope, None, send)
    finally:
        for up in floors._POOL["up"].idle:
            assert up.transport is not None
            up.transport.close()
        await backend.stop()
    assert [m["status"] for m in sent[0::2]] == [200, 200]
    assert sent[1]["body"] == b"x" * 1024
    assert (b"content-length", b"1024") in sent[0]["headers"]
    assert all(n != b"keep-alive" for n, _ in sent[0]["headers"])
    assert len(floors._POOL["up"].idle) == 1  # one connection, reused


def test_status_line_names_the_reason() -> None:
    """Known statuses get their reason phrase; unknown ones an empty one."""
    assert floors.status_line(404) == b"HTTP/1.1 404 Not Found\r\n"
    assert floors.status_line(599) == b"HTTP/1.1 599 \r\n"


def test_floors_paragraph_splits_the_proxied_cost() -> None:
    """The headroom text puts the ASGI cycle, our code and retries apart (same run)."""
    cpu = {"nginx": 20.0, "nginx-429": 5.0, "floor": 30.0, "aiohttp": 190.0, "proxied": 200.0,
           "shed": 35.0, "shed-wire-off": 60.0, FLOORS[0]: 21.0, FLOORS[1]: 55.0,
           FLOORS[2]: 180.0}  # fmt: skip
    runs = [{"row": k, "rep": 0, "cpu_us": v, "rps": 1e6 / v, "cpu_util": 1.0}
            for k, v in cpu.items()]  # fmt: skip
    s = summarize(runs, {})
    text = " ".join(floors_text(s["rows"], s["ratios"]))
    assert "21.0 us (1.05x nginx)" in text and "55.0 us (2.75x)" in text
    assert "cost 34.0 us" in text and "ASGI floor 145.0 us" in text
    assert "of which the retry stage 20.0" in text
