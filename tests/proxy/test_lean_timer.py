"""The lean transport's timeouts on one lazy timer per connection (``Conn.arm``).

The timer stays armed across the exchanges of a pooled connection; an exchange
that needs an earlier check re-arms it, one whose due time is later is checked
early and re-armed, never failed before its own bound.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from ballast_asgi.proxy.calls import direct_call
from ballast_asgi.proxy.transports.aiohttp_transport import client_timeout
from ballast_asgi.proxy.transports.lean import LeanTransport, lean_limits
from ballast_asgi.proxy.transports.lean_conn import Conn
from ballast_asgi.proxy.transports.lean_wire import HIGH_WATER_BYTES, LeanResponse
from tests.lean_support import Raw, answering, body_of, get, raw_upstream

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
LONG = client_timeout({"connect": 1.0, "read": 30.0, "write": 1.0, "pool": 1.0})
SHORT = client_timeout({"connect": 1.0, "read": 0.05, "write": 1.0, "pool": 1.0})

pytestmark = pytest.mark.anyio


async def test_exchanges_on_one_connection_share_one_timer() -> None:
    """Three exchanges on one kept-alive connection arm its timer once (no call_at per request)."""
    async with raw_upstream(answering(OK, OK, OK)) as (raw, up):
        transport = LeanTransport()
        timers = []
        for _ in range(3):
            assert await body_of(await get(transport, up, limits=LONG)) == b"ok"
            (conn,) = transport._pool.idle[(up.host, up.port)]
            timers.append(conn.timer)
        await transport.aclose()
        assert conn.timer is None  # cancelled with the connection
    assert raw.connections == 1
    assert timers[0] is not None and timers[0] is timers[1] is timers[2]


async def test_a_shorter_bound_after_a_longer_one_still_fires_on_time() -> None:
    """A pooled connection armed for 30 s: the next exchange's 50 ms bound re-arms it earlier."""
    async with raw_upstream(answering(OK)) as (raw, up):  # the second request gets no answer
        transport = LeanTransport()
        assert await body_of(await get(transport, up, limits=LONG)) == b"ok"
        async with asyncio.timeout(5.0):  # a hang fails the test instead of blocking it
            with pytest.raises(httpx.ReadTimeout):
                await get(transport, up, limits=SHORT)
        assert transport._pool.in_use == 0 and transport._pool.idle_count == 0
        await transport.aclose()
    assert raw.connections == 1


async def test_an_early_check_does_not_fail_a_longer_bound() -> None:
    """Armed for 200 ms by an earlier exchange, the timer fires during a 30 s exchange whose
    answer takes longer than 200 ms: the exchange succeeds (the check only re-arms)."""
    answered = asyncio.Event()
    # The first exchange must be answered within its bound: 200 ms, not 50, so that a
    # loaded machine's loop stall does not fail it (the CI machine is shared).
    early = client_timeout({"connect": 1.0, "read": 0.2, "write": 1.0, "pool": 1.0})

    async def late_second(raw: Raw, reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await raw.head(reader)
        w.write(OK)
        await raw.head(reader)
        await asyncio.sleep(0.5)  # the upstream's pace: past the first exchange's 200 ms bound
        w.write(OK)
        answered.set()
        await reader.read()

    async with raw_upstream(late_second) as (raw, up):
        transport = LeanTransport()
        assert await body_of(await get(transport, up, limits=early)) == b"ok"
        (conn,) = transport._pool.idle[(up.host, up.port)]
        armed = conn.timer
        assert await body_of(await get(transport, up, limits=LONG)) == b"ok"
        assert answered.is_set() and conn.timer is not armed  # fired early, re-armed
        await transport.aclose()
    assert raw.connections == 1


@pytest.mark.parametrize(
    "t",
    [
        {"connect": 2.0, "read": 30.0, "write": 30.0, "pool": 30.0},
        {"connect": 0.5, "read": 1.0, "write": 1.0, "pool": 1.0, "total": 1.0},
        {"connect": 0.5, "read": 5.0, "write": 5.0, "pool": 0.0, "total": 2.0},
        {"connect": 0.5, "read": 0.5, "write": 1.0, "pool": 1.0, "total": 2.0},
        {"connect": None, "read": None, "write": None, "pool": None},
        {"read": 1.0},
    ],
)
def test_lean_limits_are_client_timeout_without_the_dataclass(t: dict[str, float | None]) -> None:
    """``lean_limits`` gives the lean transport exactly what ``client_timeout`` would."""
    ours, theirs = lean_limits(t), client_timeout(t)
    fields = ("total", "connect", "sock_connect", "sock_read")
    assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]


async def test_a_request_deadline_bounds_the_lean_exchange_through_direct_call() -> None:
    """With a deadline (``total``), ``direct_call`` hands the lean transport its limits:
    an upstream that never answers is cut at the deadline with ReadTimeout."""
    async with raw_upstream(answering(OK)) as (_raw, up):  # the second request gets no answer
        transport = LeanTransport()
        # A first, answered exchange: the deadline's request reuses its connection, so its
        # 50 ms go to waiting for the answer. A fresh connect can take longer than 50 ms on a
        # loaded machine, and the deadline then ends it as ConnectTimeout (seen under load).
        assert await body_of(await get(transport, up, limits=LONG)) == b"ok"
        timeout = {"connect": 1.0, "read": 0.05, "write": 0.05, "pool": 0.05, "total": 0.05}
        scope = {"method": "GET", "path": "/p", "raw_path": b"/p", "query_string": b""}
        call = direct_call(transport, scope, up, [(b"host", up.netloc)], b"", timeout)
        assert call is not None
        async with asyncio.timeout(5.0):  # a hang fails the test instead of blocking it
            with pytest.raises(httpx.ReadTimeout, match="deadline"):
                await call
        await transport.aclose()


async def test_a_paused_read_is_not_the_upstreams_idle_time() -> None:
    """A consumer slower than ``sock_read`` pauses the socket read: the idle bound waits with
    it (the connection's timer re-arms while paused) and the whole body arrives."""
    size = 4 * 1024 * 1024
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size
    async with raw_upstream(answering(head + b"x" * size)) as (_raw, up):
        transport = LeanTransport()
        limits = client_timeout({"connect": 1.0, "read": 0.5, "write": 1.0, "pool": 1.0})
        response = await get(transport, up, limits=limits)
        got = 0
        async with asyncio.timeout(20.0):  # a hang fails the test instead of blocking it
            async for chunk in response.stream:  # type: ignore[attr-defined]
                if not got:
                    await asyncio.sleep(1.2)  # the consumer's pace: more than two idle bounds
                got += len(chunk)
        await response.aclose()
        await transport.aclose()
    assert got == size


class _Clock:
    """A loop stand-in for one connection: time is set by the test, timers are recorded."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Any]] = []
        self.create_future = loop.create_future

    def time(self) -> float:
        return self.now

    def call_at(self, at: float, callback: Any) -> asyncio.TimerHandle:
        self.timers.append((at, callback))
        return asyncio.TimerHandle(at, lambda: None, (), asyncio.get_running_loop())

    def fire_until(self, at: float) -> None:
        """Run every timer due by loop time ``at``, in order, as the loop would.

        A timer that keeps re-arming itself at a time already due would spin here for
        ever (a test process was seen at 100 % CPU for over an hour): after 1,000 timers
        that is a failure, not a hang.
        """
        for _ in range(1_000):
            due = sorted((t for t in self.timers if t[0] <= at), key=lambda t: t[0])
            if not due:
                self.now = at
                return
            self.timers.remove(due[0])
            self.now = due[0][0]
            due[0][1]()
        raise AssertionError(f"timers re-armed at a due time 1,000 times by {at}: a busy loop")


class _Socket:
    """The transport under a ``Conn``: only the read switch is used."""

    def __init__(self) -> None:
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def test_the_idle_bound_starts_again_when_a_paused_read_resumes() -> None:
    """Paused by a slow consumer, the timer fires and re-arms; on resume, the upstream gets a
    whole idle bound from that moment, however long ago the last re-arm was (it failed after
    a sliver of it, the CI failure of stop 37)."""
    clock = _Clock(asyncio.get_running_loop())
    conn = Conn(("127.0.0.1", 1), lambda conn, reuse: None)
    conn.loop = clock  # type: ignore[assignment]
    sock = _Socket()
    conn.transport = sock  # type: ignore[assignment]
    response = LeanResponse(conn, False, 8190, None, 0.25)  # times in binary fractions
    size = 4 * HIGH_WATER_BYTES
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
    conn.data_received(b"x" * (HIGH_WATER_BYTES + 1))  # over the high water: reading stops
    assert response.final and conn.paused and not sock.reading
    clock.fire_until(0.625)  # the consumer's pause: the timer fired at 0.25 and 0.5, re-armed
    assert response._error is None and conn.paused
    body = response.__aiter__()
    assert len(await body.__anext__()) == HIGH_WATER_BYTES + 1  # resumes reading at 0.625
    assert sock.reading and not conn.paused
    clock.fire_until(0.75)  # the timer armed at 0.5 fires 0.125 s after the resume: no failure
    assert response._error is None
    conn.data_received(b"x" * 10)  # a read at 0.75
    clock.fire_until(0.9375)
    assert response._error is None
    clock.fire_until(1.0)  # 0.25 s with no byte after the last read: failed
    assert isinstance(response._error, httpx.ReadTimeout)
