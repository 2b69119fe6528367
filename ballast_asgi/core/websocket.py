"""Websocket limits (pure): their defaults, a per-connection pace, and the buffer rule.

The websocket proxy (``ballast_asgi/proxy/websocket.py`` admits the upgrade,
``proxy/ws_relay.py`` relays the frames) reads its numbers from here; the
config section ``websocket`` references these defaults (ADR 0007).

**Pace.** Each direction of each connection has one bucket of messages and
one of bytes, each holding at most one second of its rate. Forwarding a
message of ``n`` bytes spends 1 message token and ``n`` byte tokens, and may
drive a bucket below zero (so a message larger than one second of the byte
rate still passes, once)::

    tokens  = min(rate, tokens + rate * (now - last))     for each bucket
    tokens -= cost                                         (1, or n bytes)
    wait    = max(0, -messages / messages_per_s, -bytes / bytes_per_s)

The relay waits ``wait`` seconds before it reads the next message from that
side, so a socket flooding tiny frames is held to ``max_messages_per_s``
(the server stops reading it meanwhile: TCP pushes back on the sender). The
server protocol (``ballast_asgi/server/ws.py``) spends the same buckets per
socket read, for every frame it parsed (pings and pongs too, which never
reach the relay), and pauses reading the socket for ``wait``.

**Buffer.** Bytes read from one side and not yet written to the other are
counted per connection (both directions together). A side is read only while
its connection holds less than ``buffer_bytes`` (Envoy's per-connection
buffer limit: a soft limit, so a connection holds at most ``buffer_bytes``
plus one message of ``max_message_bytes`` per direction), and every byte is
also reserved in the gateway's shared ``ByteBudget`` (``capacity.max_buffered_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DEFAULT_BUFFER_BYTES",
    "DEFAULT_CLOSE_TIMEOUT_MS",
    "DEFAULT_IDLE_TIMEOUT_MS",
    "DEFAULT_MAX_BYTES_PER_S",
    "DEFAULT_MAX_CONNECTIONS_PER_CLIENT",
    "DEFAULT_MAX_MESSAGES_PER_S",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_SEND_TIMEOUT_MS",
    "Pace",
    "RelayLimits",
]

#: Largest message accepted from either side (1 MiB, as the websockets library's default).
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
#: Bytes one connection may hold read and not yet written (Envoy's per-connection default).
DEFAULT_BUFFER_BYTES = 1024 * 1024
#: A connection with no message either way for this long is closed (nginx proxy_read_timeout).
DEFAULT_IDLE_TIMEOUT_MS = 60_000
#: One write to either side that does not finish this long closes the connection.
DEFAULT_SEND_TIMEOUT_MS = 30_000
#: The closing handshake with the upstream, after which its connection is dropped.
DEFAULT_CLOSE_TIMEOUT_MS = 1_000
#: Messages per second forwarded from one side of one connection.
DEFAULT_MAX_MESSAGES_PER_S = 1_000.0
#: Bytes per second forwarded from one side of one connection (8 MiB/s).
DEFAULT_MAX_BYTES_PER_S = 8 * 1024 * 1024
#: Open websockets one client address may hold.
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 100


@dataclass(frozen=True, slots=True)
class RelayLimits:
    """What one relayed connection may hold, how fast it may go, how long it may wait."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    idle_timeout_ms: int = DEFAULT_IDLE_TIMEOUT_MS
    send_timeout_ms: int = DEFAULT_SEND_TIMEOUT_MS
    close_timeout_ms: int = DEFAULT_CLOSE_TIMEOUT_MS
    max_messages_per_s: float = DEFAULT_MAX_MESSAGES_PER_S
    max_bytes_per_s: int = DEFAULT_MAX_BYTES_PER_S

    def __post_init__(self) -> None:
        for name in ("max_message_bytes", "buffer_bytes", "idle_timeout_ms", "send_timeout_ms",
                     "close_timeout_ms", "max_messages_per_s", "max_bytes_per_s"):  # fmt: skip
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"websocket.{name} must be > 0, got {value}")

    @property
    def idle_timeout_s(self) -> float:
        """``idle_timeout_ms`` in seconds."""
        return self.idle_timeout_ms / 1000.0

    @property
    def send_timeout_s(self) -> float:
        """``send_timeout_ms`` in seconds."""
        return self.send_timeout_ms / 1000.0

    @property
    def close_timeout_s(self) -> float:
        """``close_timeout_ms`` in seconds."""
        return self.close_timeout_ms / 1000.0


class Pace:
    """One direction's message and byte buckets (see the module docstring)."""

    __slots__ = ("_bytes", "_bytes_per_s", "_last", "_messages", "_messages_per_s")

    def __init__(self, messages_per_s: float, bytes_per_s: float, now: float) -> None:
        if not messages_per_s > 0 or not bytes_per_s > 0:
            raise ValueError(
                f"rates must be > 0, got {messages_per_s} messages/s, {bytes_per_s} bytes/s"
            )
        self._messages_per_s = float(messages_per_s)
        self._bytes_per_s = float(bytes_per_s)
        self._messages = self._messages_per_s
        self._bytes = self._bytes_per_s
        self._last = now

    def take(self, n_bytes: int, now: float, messages: int = 1) -> float:
        """Spend ``messages`` (frames) of ``n_bytes`` in all; the seconds to wait before the
        next read (0: none)."""
        elapsed = max(0.0, now - self._last)
        self._last = max(self._last, now)
        rate_m, rate_b = self._messages_per_s, self._bytes_per_s
        self._messages = min(rate_m, self._messages + elapsed * rate_m) - messages
        self._bytes = min(rate_b, self._bytes + elapsed * rate_b) - n_bytes
        return max(0.0, -self._messages / rate_m, -self._bytes / rate_b)
