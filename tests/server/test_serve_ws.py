"""The paced websocket server protocol on a fake loop and transport (no sockets, no sleep)."""

from __future__ import annotations

from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from ballast_asgi.config.models import WebSocketConfig
from ballast_asgi.server.ws import PacedWebSocketProtocol, paced_protocol
from tests.server.test_serve_head_timer import FakeLoop
from tests.server.test_serve_head_timer import FakeTransport as _Transport

pytestmark = pytest.mark.anyio

UPGRADE = (
    b"GET / HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
PING = b"\x89\x80\x00\x00\x00\x00"  # a masked ping frame without payload
TEXT = b"\x81\x81\x00\x00\x00\x00x"  # a masked text frame "x"


class Transport(_Transport):
    """The fake transport, recording whether reading is paused."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def _app(scope: Any, receive: Any, send: Any) -> None:
    return None


async def _accepted(rate: float) -> tuple[PacedWebSocketProtocol, FakeLoop, Transport]:
    """A paced protocol at ``rate`` frames/s whose upgrade the app accepted."""
    loop = FakeLoop()
    cls = paced_protocol(WebSocketConfig(max_messages_per_s=rate))
    config = Config(app=_app, ws=cls, lifespan="off", log_level="error")
    config.load()
    protocol = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)  # type: ignore[arg-type]
    transport = Transport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(UPGRADE)
    assert await protocol.receive() == {"type": "websocket.connect"}
    await protocol.send({"type": "websocket.accept"})
    return protocol, loop, transport


async def test_a_ping_flood_pauses_reading_for_the_debt_and_then_resumes() -> None:
    """3,000 pings in one read at 1,000 frames/s (a 1 s bucket): reading stops for 2 s."""
    protocol, loop, transport = await _accepted(1000.0)
    protocol.data_received(PING * 3000)
    assert not transport.reading
    timers = [h for h in loop.handles if not h.cancelled and h.callback.__name__ == "<lambda>"]
    assert any(abs(h.when - (loop.now + 2.0)) < 0.01 for h in timers)
    loop.advance(1.9)
    assert not transport.reading
    loop.advance(0.2)
    assert transport.reading


async def test_frames_within_the_rate_never_pause_reading() -> None:
    """Ten pings at 1,000 frames/s: answered, reading never paused."""
    protocol, _, transport = await _accepted(1000.0)
    written = len(transport.written)
    protocol.data_received(PING * 10)
    assert transport.reading and len(transport.written) > written  # the pongs went out


async def test_the_pace_does_not_undo_uvicorns_pause_for_the_app() -> None:
    """A data message makes uvicorn pause for the app; the pace timer firing keeps it paused,
    and the app's receive resumes reading only once the pace lets it."""
    protocol, loop, transport = await _accepted(1.0)
    protocol.data_received(TEXT * 3)  # 1 frame/s, the upgrade took the token: 3 s of debt
    assert not transport.reading and protocol.read_paused
    loop.advance(3.5)
    assert not transport.reading  # uvicorn's pause for the app still holds
    for _ in range(3):
        message = await protocol.receive()
        assert message == {"type": "websocket.receive", "text": "x"}
    assert transport.reading
