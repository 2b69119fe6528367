"""The request cycle's joined writes (``ResponseCycle``, ``server/cycle.py``), write by write.

What used to be ``JoinedWrites``'s unit tests (issue 18), on the cycle that
does the joining now: one socket write for a small response, a streamed head
or chunk written on the next loop turn, 64 KiB written at once, the held bytes
written before the protocol writes itself (its 400), nothing written once the
transport closes. A real ``GuardedHttpToolsProtocol`` on the running loop and a
transport that records each ``write`` call (no sockets; the byte equivalence
with uvicorn is ``test_cycle_equivalence.py``/``test_cycle_framing.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from ballast_asgi.config.models import ServerConfig
from ballast_asgi.server.cycle import ResponseCycle
from ballast_asgi.server.guarded import GuardedHttpToolsProtocol, guarded_protocol
from ballast_asgi.server.joined import _JOIN_LIMIT

pytestmark = pytest.mark.anyio

HEAD_LEN = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]}
HEAD_CHUNKED = {"type": "http.response.start", "status": 200, "headers": []}


class FakeTransport:
    """Records each write call (not just the bytes) and the close."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def write(self, data: bytes) -> None:
        assert not self.closed, "written after the close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        return None

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


async def _app(scope: Any, receive: Any, send: Any) -> None:
    return None


Made = tuple[ResponseCycle, FakeTransport, GuardedHttpToolsProtocol]


def _cycle(keep_alive: bool = True) -> Made:
    """A cycle of a real guarded protocol on the running loop, its transport recording."""
    cls = guarded_protocol(ServerConfig())
    config = Config(app=_app, http=cls, lifespan="off", log_level="error", access_log=False)
    config.load()
    loop = asyncio.get_running_loop()
    protocol = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport = FakeTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    scope = {"method": "GET", "http_version": "1.1"}
    cycle = ResponseCycle(protocol, scope, keep_alive, False)
    protocol.cycle = cycle
    return cycle, transport, protocol


def _head(cycle: ResponseCycle, message: dict[str, Any]) -> bytes:
    """The bytes the cycle writes for ``message`` (its status line and headers)."""
    return ResponseCycle(cycle.protocol, dict(cycle.scope), True, False)._head(message)


async def test_a_small_response_is_one_write_when_it_completes() -> None:
    """Head and body reach the transport as one write, in order, when the body completes."""
    cycle, transport, _ = _cycle()
    head = _head(cycle, HEAD_LEN)
    await cycle.send(HEAD_LEN)
    assert transport.writes == []
    await cycle.send({"type": "http.response.body", "body": b"body", "more_body": False})
    assert transport.writes == [head + b"body"]
    await asyncio.sleep(0)  # the flush scheduled by the head finds nothing left
    assert transport.writes == [head + b"body"] and not transport.closed


async def test_a_streamed_head_and_chunk_go_out_on_the_next_loop_turn() -> None:
    """A head left alone (a streamed response) is written on the next loop iteration, and
    so is each chunk after it: nothing of a stream is held longer than one turn."""
    cycle, transport, _ = _cycle()
    head = _head(cycle, HEAD_CHUNKED)
    await cycle.send(HEAD_CHUNKED)
    assert transport.writes == []
    await asyncio.sleep(0)
    assert transport.writes == [head]
    await cycle.send({"type": "http.response.body", "body": b"chunk", "more_body": True})
    assert transport.writes == [head]
    await asyncio.sleep(0)
    assert transport.writes == [head, b"5\r\nchunk\r\n"]


async def test_64_kib_pending_are_written_at_once() -> None:
    """Once ``_JOIN_LIMIT`` bytes are pending they are written without waiting for the loop."""
    cycle, transport, _ = _cycle()
    start = {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-length", str(_JOIN_LIMIT + 10).encode())],
    }
    head = _head(cycle, start)
    await cycle.send(start)
    body = b"x" * _JOIN_LIMIT
    await cycle.send({"type": "http.response.body", "body": body, "more_body": True})
    assert transport.writes == [head + body]
    await cycle.send({"type": "http.response.body", "body": b"y" * 10, "more_body": False})
    assert transport.writes == [head + body, b"y" * 10]


async def test_held_bytes_are_written_before_the_protocol_writes_itself() -> None:
    """A response held for the loop turn is flushed before the protocol's own write (its
    400 for a malformed request that arrives meanwhile): the bytes stay in order."""
    cycle, transport, protocol = _cycle()
    head = _head(cycle, HEAD_CHUNKED)
    await cycle.send(HEAD_CHUNKED)
    assert transport.writes == [] and protocol._writing is cycle
    protocol.data_received(b"\x00not http\r\n\r\n")
    assert transport.writes[0] == head
    assert transport.writes[1].startswith(b"HTTP/1.1 400 ")
    assert protocol._writing is None


async def test_a_closing_response_is_flushed_then_closed_and_nothing_follows() -> None:
    """A response that closes the connection is one write then the close; bytes held when
    the transport is already closing are dropped, never written after the close."""
    cycle, transport, _ = _cycle(keep_alive=False)
    await cycle.send(HEAD_LEN)
    await cycle.send({"type": "http.response.body", "body": b"body", "more_body": False})
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"\r\n\r\nbody")
    assert b"connection: close\r\n" in transport.writes[0] and transport.closed

    streamed, gone, _ = _cycle()
    await streamed.send(HEAD_CHUNKED)
    gone.closed = True  # the client went away before the loop turned
    await asyncio.sleep(0)
    assert gone.writes == []
