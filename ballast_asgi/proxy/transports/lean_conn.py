"""One upstream HTTP/1.1 connection of the lean transport: its ``asyncio.Protocol``.

``Conn`` is the protocol of one pooled connection (``lean.py`` opens and
pools them): ``TCP_NODELAY`` on connect, every read handed to the exchange in
progress (``LeanResponse``, ``lean_wire.py``), EOF and loss reported to it,
reading paused and resumed for a slow consumer. Bytes that arrive with no
exchange in progress make the connection unusable: it is closed. At most one
exchange at a time; ``release(conn, reuse)`` gives it back to the pool.

The exchange's timeouts run on one lazy timer per connection (``arm``): it
stays armed across exchanges and is re-armed only when an exchange needs an
earlier check than the one already due; a check that comes early re-arms for
the exchange's own due time (``LeanResponse.on_timer``), so every bound is as
strict as with a timer per exchange, without a ``call_at`` and a ``cancel``
per request. It is cancelled when the connection closes. The bounds it checks
come as ``Limits`` (aiohttp's ``ClientTimeout``, or ``LeanLimits``: the same
values without the dataclass, ``lean_limits``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol, cast

if TYPE_CHECKING:
    from ballast_asgi.proxy.transports.lean_wire import LeanResponse


class Limits(Protocol):
    """What the lean transport reads of its timeouts (aiohttp's ``ClientTimeout`` has it)."""

    @property
    def total(self) -> float | None:
        """Bound on the whole exchange, body included (the request's deadline)."""

    @property
    def connect(self) -> float | None:
        """Bound on waiting for a pool slot plus connecting."""

    @property
    def sock_connect(self) -> float | None:
        """Bound on the connect itself."""

    @property
    def sock_read(self) -> float | None:
        """Bound on the gap between reads."""


class LeanLimits:
    """``client_timeout``'s values, without aiohttp's ``ClientTimeout`` (a frozen dataclass
    that costs about a microsecond to build: one per request with a deadline)."""

    __slots__ = ("connect", "sock_connect", "sock_read", "total")

    def __init__(
        self,
        total: float | None,
        connect: float | None,
        sock_connect: float | None,
        sock_read: float | None,
    ) -> None:
        self.total = total
        self.connect = connect
        self.sock_connect = sock_connect
        self.sock_read = sock_read


def lean_limits(t: Mapping[str, float | None]) -> LeanLimits:
    """What ``aiohttp_adapt.client_timeout(t)`` gives, as a ``LeanLimits`` (tested equal)."""
    connect, read, total = t.get("connect"), t.get("read"), t.get("total")
    acquire = None if connect is None else connect + (t.get("pool") or 0.0)
    if total is not None and read is not None and read >= total:
        read = None  # the total fires first
    return LeanLimits(total, acquire, connect, read)


Release = Callable[["Conn", bool], None]


class Conn(asyncio.Protocol):
    """One upstream connection; at most one exchange at a time."""

    __slots__ = (
        "closed", "exchange", "idle_since", "key", "loop", "paused", "release", "rest",
        "timer", "timer_at", "transport",
    )  # fmt: skip

    def __init__(self, key: tuple[str, int], release: Release) -> None:
        self.key = key
        self.release = release
        self.transport: asyncio.Transport | None = None
        self.exchange: LeanResponse | None = None
        self.closed = False
        self.paused = False
        self.idle_since = 0.0
        #: Its last answer was a 500: it sits out ``REST_S`` before reuse (``lean.py``).
        self.rest = False
        self.loop = asyncio.get_running_loop()
        #: The lazy timer (None: not armed) and the loop time it fires at.
        self.timer: asyncio.TimerHandle | None = None
        self.timer_at = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        exchange = self.exchange
        if exchange is None:  # bytes nobody asked for: the connection is unusable
            self.close()
            return
        exchange.feed(data)

    def eof_received(self) -> bool | None:
        self.closed = True
        if self.exchange is not None:
            self.exchange.lost(None)
        return None  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._disarm()
        if self.exchange is not None:
            self.exchange.lost(exc)

    def arm(self, at: float) -> None:
        """Have the timer fire at loop time ``at`` or earlier (kept when it already does)."""
        timer = self.timer
        if timer is not None:
            if self.timer_at <= at:
                return  # fires first; the exchange re-arms for its own due time then
            timer.cancel()
        self.timer_at = at
        self.timer = self.loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self.timer = None
        exchange = self.exchange
        if exchange is not None:
            exchange.on_timer()

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def pause(self, on: bool) -> None:
        """Stop (``on``) or resume reading the socket."""
        if self.paused != on and self.transport is not None and not self.closed:
            self.paused = on
            if on:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def close(self) -> None:
        """Close the socket (idempotent)."""
        self.closed = True
        self._disarm()
        if self.transport is not None:
            self.transport.close()
