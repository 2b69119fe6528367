"""The websocket server protocol under the gateway: every frame a client sends is paced.

uvicorn's websocket protocol (``websockets-sansio``, its default) parses each
socket read completely: it answers every ping at once and queues every data
message for the app. The relay paces data messages (``proxy/ws_relay.py``),
but pings and pongs never reach it: one socket sending ping frames as fast as
it can had the gateway answer about 96,000 pongs a second and
``/_ballast/health`` time out (``python -m experiments.wsattack --ping``).

``PacedWebSocketProtocol`` counts the frames each read produced (every
opcode) and its bytes in a ``Pace`` (``core/websocket.py``) with the
``websocket.max_messages_per_s`` / ``max_bytes_per_s`` rates; when the bucket
runs into debt it stops reading the socket for the time the debt takes to
repay (one loop timer), so TCP pushes back on the sender. uvicorn's own pause
(one message at a time for the app) is kept: reading resumes only when
neither holds it.

``ballast`` passes it to uvicorn (``serve.websocket_settings``); under
``uvicorn ballast_asgi.gateway:app`` the gateway installs it when uvicorn left
``--ws`` at its default.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn._types import ASGIReceiveEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from ballast_asgi.config.models import WebSocketConfig
from ballast_asgi.core.websocket import Pace

__all__ = ["PacedWebSocketProtocol", "paced_protocol"]


class PacedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websocket protocol with a frame and byte pace per connection."""

    max_frames_per_s: float = WebSocketConfig().max_messages_per_s
    max_bytes_per_s: float = WebSocketConfig().max_bytes_per_s

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pace = Pace(self.max_frames_per_s, self.max_bytes_per_s, self.loop.time())
        self._pace_timer: asyncio.TimerHandle | None = None
        self._frames = 0
        parsed = self.conn.events_received

        def counted() -> Any:
            events = parsed()
            self._frames += len(events)
            return events

        self.conn.events_received = counted  # type: ignore[method-assign]

    def data_received(self, data: bytes) -> None:
        self._frames = 0
        super().data_received(data)
        delay = self._pace.take(len(data), self.loop.time(), max(1, self._frames))
        if delay > 0 and self._pace_timer is None and not self.transport.is_closing():
            self.transport.pause_reading()
            self._pace_timer = self.loop.call_later(delay, self._paced)

    def _paced(self) -> None:
        """The debt is repaid: read again unless uvicorn holds reading for the app."""
        self._pace_timer = None
        if not self.read_paused and not self.transport.is_closing():
            self.transport.resume_reading()

    async def receive(self) -> ASGIReceiveEvent:
        """uvicorn's ``receive``, except that reading stays paused while the pace holds it."""
        message = await self.queue.get()
        if self.read_paused and self.queue.empty():
            self.read_paused = False
            if self._pace_timer is None:
                self.transport.resume_reading()
        return message

    def connection_lost(self, exc: Exception | None) -> None:
        if self._pace_timer is not None:
            self._pace_timer.cancel()
            self._pace_timer = None
        super().connection_lost(exc)


def paced_protocol(websocket: WebSocketConfig) -> type[PacedWebSocketProtocol]:
    """A ``PacedWebSocketProtocol`` with the rates of ``websocket``."""
    attrs = {
        "max_frames_per_s": websocket.max_messages_per_s,
        "max_bytes_per_s": websocket.max_bytes_per_s,
    }
    return type("PacedWebSocketProtocol", (PacedWebSocketProtocol,), attrs)
