"""The websocket relay in process: a fake client (ASGI receive/send) and a fake upstream.

The idle timeout and the pace are driven in virtual time (``VirtualTime``: the
clock moves to the next sleeper's due time only once every task waits); the
send and close timeouts are short configured ones on the loop. Nothing sleeps
for correctness.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Coroutine
from typing import Any, cast

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

from ballast_asgi.core.capacity import ByteBudget
from ballast_asgi.core.types import Message
from ballast_asgi.core.websocket import RelayLimits
from ballast_asgi.proxy.ws_relay import Relay

pytestmark = pytest.mark.anyio

#: Time enough for anything the relay must do at once; a relay that blocks hits it.
BOUND_S = 5.0
#: Loop turns that let every runnable task reach its next wait (the fakes are in memory).
_SETTLE = 100


class VirtualTime:
    """A clock and a ``sleep`` in virtual time: it jumps to the earliest due sleeper when idle."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self._due: list[tuple[float, int, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._due, (self.now + max(0.0, seconds), id(future), future))
        await future

    async def run(self, coro: Coroutine[Any, Any, str]) -> str:
        """Run ``coro`` to its end, moving time whenever everything waits."""
        task = asyncio.ensure_future(coro)
        while not task.done():
            for _ in range(_SETTLE):
                await asyncio.sleep(0)
            if self._due and not task.done():
                due, _, future = heapq.heappop(self._due)
                self.now = max(self.now, due)
                if not future.done():
                    future.set_result(None)
        return task.result()


class Transport:
    """The upstream connection's transport: records an abort."""

    def __init__(self) -> None:
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True


class Upstream:
    """A fake upstream connection: records sends and closes; ``stalled`` never takes a send."""

    def __init__(self, *, stalled: bool = False) -> None:
        self.stalled = stalled
        self.sent: list[str | bytes] = []
        self.inbox: asyncio.Queue[str | bytes | tuple[int, str]] = asyncio.Queue()
        self.closed_with: tuple[int, str] | None = None
        self.close_code: int | None = None
        self.close_reason: str | None = None
        self.transport = Transport()

    async def send(self, data: str | bytes) -> None:
        if self.stalled:
            await asyncio.Event().wait()
        self.sent.append(data)

    async def recv(self) -> str | bytes:
        item = await self.inbox.get()
        if isinstance(item, tuple):
            self.close_code, self.close_reason = item
            raise ConnectionClosed(Close(*item), None)
        return item

    async def close(self, code: int = 1000, reason: str = "") -> None:
        self.closed_with = (code, reason)


class Client:
    """The ASGI side: ``receive`` takes from a queue; ``send`` records (or hangs when stuck)."""

    def __init__(self, *, stuck: bool = False) -> None:
        self.inbox: asyncio.Queue[Message] = asyncio.Queue()
        self.sent: list[Message] = []
        self.stuck = stuck
        self.receives = 0

    def say(self, *items: str | bytes) -> None:
        for item in items:
            key = "text" if isinstance(item, str) else "bytes"
            self.inbox.put_nowait({"type": "websocket.receive", key: item})

    def leave(self, code: int = 1006) -> None:
        self.inbox.put_nowait({"type": "websocket.disconnect", "code": code})

    async def receive(self) -> Message:
        self.receives += 1
        return await self.inbox.get()

    async def send(self, message: Message) -> None:
        if self.stuck and message["type"] == "websocket.send":
            await asyncio.Event().wait()
        self.sent.append(message)

    def closes(self) -> list[tuple[int, str]]:
        return [(m["code"], m["reason"]) for m in self.sent if m["type"] == "websocket.close"]


def _relay(
    client: Client,
    upstream: Upstream,
    *,
    budget: ByteBudget | None = None,
    virtual: VirtualTime | None = None,
    **limits: Any,
) -> Relay:
    """A relay on real loop time, or on ``virtual`` time."""
    budgets = (budget or ByteBudget(2**40),)
    return Relay(
        client.receive, client.send, cast(ClientConnection, upstream),
        limits=RelayLimits(**limits), budgets=budgets,
        clock=virtual or time.monotonic, sleep=virtual.sleep if virtual else asyncio.sleep,
    )  # fmt: skip


async def _run(relay: Relay) -> str:
    async with asyncio.timeout(BOUND_S):
        return await relay.run()


async def test_messages_go_both_ways_in_order_and_the_client_close_reaches_the_upstream() -> None:
    """Client text and bytes reach the upstream in order, then its 4002 close."""
    client, upstream = Client(), Upstream()
    client.say("a", b"b", "c")
    client.leave(4002)
    upstream.inbox.put_nowait("from upstream")
    assert await _run(_relay(client, upstream)) == "client_closed"
    assert upstream.sent == ["a", b"b", "c"]
    assert upstream.closed_with == (4002, "")


async def test_upstream_close_reaches_the_client_after_its_pending_messages() -> None:
    """The upstream sends two messages and closes 4001 'bye': the client gets both, then 4001."""
    client, upstream = Client(), Upstream()
    for item in ("one", b"two", (4001, "bye")):
        upstream.inbox.put_nowait(item)
    assert await _run(_relay(client, upstream)) == "upstream_closed"
    data = [m.get("text", m.get("bytes")) for m in client.sent if m["type"] == "websocket.send"]
    assert data == ["one", b"two"]
    assert client.closes() == [(4001, "bye")]


async def test_client_disconnect_is_noticed_while_an_upstream_send_is_stuck() -> None:
    """A stalled upstream: the client leaves; the relay ends within the send timeout, bytes back."""
    client, upstream = Client(), Upstream(stalled=True)
    budget = ByteBudget(2**40)
    client.say(b"x" * 1000)
    client.leave()
    relay = _relay(client, upstream, budget=budget, send_timeout_ms=50)
    assert await _run(relay) == "upstream_send_timeout"
    assert upstream.transport.aborted
    assert budget.used_bytes == 0 and relay.held.used == 0
    assert client.receives == 2  # the disconnect was read while the send hung


async def test_a_stalled_upstream_times_out_and_the_client_gets_1011() -> None:
    """No disconnect: the stuck upstream send ends the relay with 1011 to the client."""
    client, upstream = Client(), Upstream(stalled=True)
    client.say("hello")
    assert await _run(_relay(client, upstream, send_timeout_ms=30)) == "upstream_send_timeout"
    assert client.closes() == [(1011, "upstream timeout")]
    assert upstream.transport.aborted


async def test_reading_stops_at_the_buffer_limit_and_the_shared_budget_counts_it() -> None:
    """A stalled upstream and a client with 100 KiB messages: about buffer_bytes are read."""
    client, upstream = Client(), Upstream(stalled=True)
    budget = ByteBudget(2**40)
    kib = 1024
    client.say(*[b"m" * (100 * kib) for _ in range(50)])
    relay = _relay(client, upstream, budget=budget, buffer_bytes=300 * kib, send_timeout_ms=10_000)
    task = asyncio.ensure_future(relay.run())
    for _ in range(200):  # let the readers run until they block on the buffer
        await asyncio.sleep(0)
    assert relay.held.used == 300 * kib  # three messages, then no more reads
    assert budget.used_bytes == 300 * kib
    assert client.receives == 3 and client.inbox.qsize() == 47
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert budget.used_bytes == 0 and upstream.transport.aborted


async def test_a_full_shared_budget_closes_the_connection_with_1013() -> None:
    """The gateway's byte budget cannot take the message: 1013 to the client, 1001 upstream."""
    client, upstream = Client(), Upstream()
    client.say(b"z" * 2000)
    assert await _run(_relay(client, upstream, budget=ByteBudget(1000))) == "buffer_full"
    assert client.closes() == [(1013, "try again later")]
    assert upstream.closed_with == (1001, "") and upstream.sent == []


async def test_a_client_message_over_max_message_bytes_closes_with_1009() -> None:
    """A message larger than max_message_bytes is not forwarded: 1009 to the client."""
    client, upstream = Client(), Upstream()
    client.say("ok", b"y" * 2048)
    assert await _run(_relay(client, upstream, max_message_bytes=1024)) == "too_big"
    assert upstream.sent == ["ok"]
    assert client.closes() == [(1009, "message too big")]


async def test_an_idle_connection_is_closed_on_both_sides() -> None:
    """Nothing either way for idle_timeout_ms (60 s): 1001 'idle timeout' to both sides."""
    client, upstream, virtual = Client(), Upstream(), VirtualTime()
    relay = _relay(client, upstream, virtual=virtual)
    async with asyncio.timeout(BOUND_S):
        assert await virtual.run(relay.run()) == "idle"
    assert virtual.now == pytest.approx(1_000.0 + 60.0)
    assert client.closes() == [(1001, "idle timeout")]
    assert upstream.closed_with == (1001, "idle timeout")


async def test_traffic_keeps_a_connection_out_of_the_idle_timeout() -> None:
    """A message at 0.9 s moves a 1 s idle timeout: the relay ends idle at 1.9 s."""
    client, upstream, virtual = Client(), Upstream(), VirtualTime()
    relay = _relay(client, upstream, virtual=virtual, idle_timeout_ms=1_000)

    async def later() -> None:
        await virtual.sleep(0.9)
        client.say("ping")

    talker = asyncio.ensure_future(later())
    async with asyncio.timeout(BOUND_S):
        assert await virtual.run(relay.run()) == "idle"
    await talker
    assert virtual.now == pytest.approx(1_000.0 + 1.9)
    assert upstream.sent == ["ping"]


async def test_a_flood_of_tiny_messages_is_read_at_the_configured_rate() -> None:
    """3000 messages at once at 1000/s (a 1 s burst): forwarding them takes 2 s (virtual)."""
    client, upstream, virtual = Client(), Upstream(), VirtualTime()
    client.say(*["x"] * 3000)
    client.leave(1000)
    relay = _relay(client, upstream, virtual=virtual, max_messages_per_s=1000.0)
    async with asyncio.timeout(BOUND_S):
        assert await virtual.run(relay.run()) == "client_closed"
    assert len(upstream.sent) == 3000
    assert virtual.now - 1_000.0 == pytest.approx(2.0, abs=0.01)


async def test_a_client_that_stops_reading_ends_the_relay_after_the_send_timeout() -> None:
    """The ASGI send never returns: the relay ends and the upstream is closed with 1001."""
    client, upstream = Client(stuck=True), Upstream()
    upstream.inbox.put_nowait("for you")
    assert await _run(_relay(client, upstream, send_timeout_ms=30)) == "client_send_timeout"
    assert upstream.closed_with == (1001, "")


async def test_an_upstream_that_never_answers_the_close_is_aborted() -> None:
    """The closing handshake is bounded by close_timeout_ms; then the connection is dropped."""
    client, upstream = Client(), Upstream()

    async def never(code: int = 1000, reason: str = "") -> None:
        await asyncio.Event().wait()

    upstream.close = never  # type: ignore[method-assign]
    client.leave(1000)
    assert await _run(_relay(client, upstream, close_timeout_ms=20)) == "client_closed"
    assert upstream.transport.aborted
