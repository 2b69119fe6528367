"""The guarded protocol's lazy request-head timer, driven by a fake loop (no sockets, no sleep)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from ballast_asgi.config.models import ServerConfig
from ballast_asgi.server.serve import (
    LINGER_IDLE_S,
    LINGER_MAX_S,
    GuardedHttpToolsProtocol,
    guarded_protocol,
)

TIMEOUT_MS = 1_000
HEAD = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


class _Handle:
    def __init__(self, loop: FakeLoop, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False
        loop.handles.append(self)

    def cancel(self) -> None:
        self.cancelled = True


class _Task:
    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        return None


class FakeLoop:
    """The loop methods the protocol uses, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.handles: list[_Handle] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[..., None], *args: Any) -> _Handle:
        return _Handle(self, when, lambda: callback(*args))

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> _Handle:
        return self.call_at(self.now + delay, callback, *args)

    def create_task(self, coro: Any, **_: Any) -> _Task:
        coro.close()  # the app is not run here: only the head's timing is under test
        return _Task()

    def advance(self, seconds: float) -> None:
        """Move the clock and run every timer that is due."""
        self.now += seconds
        while due := [h for h in self.handles if not h.cancelled and h.when <= self.now]:
            for handle in due:
                self.handles.remove(handle)
                handle.callback()


class FakeTransport:
    """A transport that records what the protocol writes."""

    def __init__(self) -> None:
        self.written = b""
        self.closed = False
        self.eof = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None


async def _app(scope: Any, receive: Any, send: Any) -> None:
    return None


@pytest.fixture
def wired() -> tuple[GuardedHttpToolsProtocol, FakeLoop, FakeTransport]:
    loop = FakeLoop()
    cls = guarded_protocol(ServerConfig(header_timeout_ms=TIMEOUT_MS))
    config = Config(app=_app, http=cls, lifespan="off", log_level="error")
    config.load()
    protocol = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    transport = FakeTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    return protocol, loop, transport


def _live(loop: FakeLoop) -> list[_Handle]:
    return [h for h in loop.handles if not h.cancelled]


def test_heads_completed_in_time_share_one_timer_per_connection(
    wired: tuple[GuardedHttpToolsProtocol, FakeLoop, FakeTransport],
) -> None:
    """Fifty heads on one keep-alive connection: one timer armed, none cancelled, no 408."""
    protocol, loop, transport = wired
    for _ in range(50):
        protocol.data_received(HEAD)
        loop.advance(0.001)
    assert len(loop.handles) == 1 and not loop.handles[0].cancelled
    loop.advance(TIMEOUT_MS / 1000.0)
    assert not transport.closed and transport.written == b""
    assert _live(loop) == []  # it lapsed: no head was in progress when it fired


def test_a_later_slow_head_is_timed_from_its_own_first_byte(
    wired: tuple[GuardedHttpToolsProtocol, FakeLoop, FakeTransport],
) -> None:
    """The timer armed for an earlier head re-arms for the head in progress, then 408s it."""
    protocol, loop, transport = wired
    protocol.data_received(HEAD)
    loop.advance(0.6)
    protocol.data_received(b"GET / HTTP/1.1\r\nhost")  # a second head begins at t = 0.6 s
    loop.advance(0.5)  # the first timer fired at 1.0 s: 0.4 s into this head, re-armed
    assert not transport.closed
    assert [h.when for h in _live(loop)] == [pytest.approx(100.0 + 0.6 + 1.0)]
    loop.advance(0.5)
    assert transport.eof and transport.written.startswith(b"HTTP/1.1 408")
    loop.advance(LINGER_IDLE_S)
    assert transport.closed


def test_a_refused_head_lingers_then_closes(
    wired: tuple[GuardedHttpToolsProtocol, FakeLoop, FakeTransport],
) -> None:
    """After a 431: FIN at once, later bytes read and discarded, closed once the client is quiet."""
    protocol, loop, transport = wired
    protocol.max_header_bytes = 64
    protocol.data_received(b"GET / HTTP/1.1\r\nx-big: " + b"a" * 100)
    assert transport.written.startswith(b"HTTP/1.1 431") and transport.eof
    assert not transport.closed  # closing now would reset what the client still sends
    for _ in range(3):
        loop.advance(LINGER_IDLE_S / 2)
        protocol.data_received(b"\x00garbage that is never parsed\r\n\r\n")
    assert not transport.closed and transport.written.count(b"HTTP/1.1") == 1
    loop.advance(LINGER_IDLE_S)
    assert transport.closed


def test_a_client_that_keeps_sending_is_closed_after_the_linger_maximum(
    wired: tuple[GuardedHttpToolsProtocol, FakeLoop, FakeTransport],
) -> None:
    """Lingering is bounded: a client sending forever is closed LINGER_MAX_S after the refusal."""
    protocol, loop, transport = wired
    protocol.max_header_bytes = 64
    protocol.data_received(b"GET / HTTP/1.1\r\nx-big: " + b"a" * 100)
    steps = 0
    while not transport.closed:
        loop.advance(LINGER_IDLE_S / 4)
        protocol.data_received(b"a" * 1000)
        steps += 1
    assert steps * LINGER_IDLE_S / 4 == pytest.approx(LINGER_MAX_S, abs=LINGER_IDLE_S / 4)


def test_a_connection_that_sends_nothing_is_closed_at_the_timeout(
    wired: tuple[GuardedHttpToolsProtocol, FakeLoop, FakeTransport],
) -> None:
    """No byte within the head timeout: closed without a response."""
    _, loop, transport = wired
    loop.advance(0.999)
    assert not transport.closed
    loop.advance(0.001)
    assert transport.closed and transport.written == b""


def test_a_lost_connection_cancels_its_timer(
    wired: tuple[GuardedHttpToolsProtocol, FakeLoop, FakeTransport],
) -> None:
    """connection_lost leaves no timer behind."""
    protocol, loop, _ = wired
    protocol.connection_lost(None)
    assert _live(loop) == []
