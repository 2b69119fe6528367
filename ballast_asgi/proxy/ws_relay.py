"""Relay an accepted websocket: each direction a reader and a writer, every wait bounded.

Four tasks per connection, plus an idle watchdog::

    client  --receive()-->  [reader] -> pipe -> [writer]  --upstream.send()-->  upstream
    client  <--send()-----  [writer] <- pipe <- [reader]  <--upstream.recv()--  upstream

A reader keeps reading its side while the connection holds less than
``buffer_bytes`` (``core/websocket.py``: the buffer rule and the pace), so a
side that closes or disconnects is noticed while the other side's writes are
still pending; the bytes it reads stay reserved in the connection's count and
in the gateway's shared ``ByteBudget`` (``capacity.max_buffered_bytes``) until
the writer has handed them on. Each write (``upstream.send``, the ASGI
``websocket.send``) has ``send_timeout_ms``; no message either way for
``idle_timeout_ms`` closes both sides. A reader paces its side
(``max_messages_per_s``, ``max_bytes_per_s``) by waiting before its next read.

How a relay ends (the first of these wins; the label is counted in
``ballast_websocket_closed_total``):

========================  ==========================  ============================
label                     client gets                 upstream gets
========================  ==========================  ============================
``client_closed``         (it closed)                 its code after the pending messages
``upstream_closed``       the code after the pending  (it closed)
``idle``                  1001 ``idle timeout``       1001 ``idle timeout``
``upstream_send_timeout`` 1011 ``upstream timeout``   connection aborted
``client_send_timeout``   nothing more (stuck)        1001
``too_big``               1009 ``message too big``    1001
``buffer_full``           1013 ``try again later``    1001 (a ``capacity`` shed)
========================  ==========================  ============================

The close to the client is bounded by ``send_timeout_ms``; the closing
handshake with the upstream by ``close_timeout_ms`` (then its connection is
aborted, as nginx drops it at once). Every bounded wait uses
``asyncio.timeout``: Python 3.11's ``wait_for`` can lose a cancellation that
arrives as the awaited call finishes, and a relay task that missed its
cancellation would hold the connection's slot. Whatever way it ends, every
reserved byte is given back. The pieces a relay is built of (the bytes held,
a direction's pipe, the close values, ``sendable``) are ``ws_pipes.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from ballast_asgi.core.capacity import ByteBudget
from ballast_asgi.core.types import Clock, Receive, Send
from ballast_asgi.core.websocket import Pace, RelayLimits
from ballast_asgi.proxy.ws_pipes import (
    ABORT,
    Close,
    Data,
    End,
    Held,
    Pipe,
    message_size,
    sendable,
)

__all__ = ["ABORT", "Relay", "sendable"]

Sleep = Callable[[float], Awaitable[Any]]


class Relay:
    """One accepted connection's frames both ways, until one side closes or a limit ends it."""

    def __init__(
        self,
        receive: Receive,
        send: Send,
        upstream: ClientConnection,
        *,
        limits: RelayLimits,
        budgets: tuple[ByteBudget, ...],
        clock: Clock,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.receive, self.send, self.upstream = receive, send, upstream
        self.limits = limits
        self.clock = clock
        self.sleep = sleep
        self.held = Held(limits.buffer_bytes, budgets)
        self.last_activity = clock()
        self._done: asyncio.Future[End] = asyncio.get_running_loop().create_future()
        self._to_upstream = Pipe()
        self._to_client = Pipe()
        self._flush_by: float | None = None
        self._tasks: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> str:
        """Relay until the end; close both sides as the end says; the end's label."""
        tasks = {
            "client_reader": self._client_reader(),
            "upstream_writer": self._upstream_writer(),
            "upstream_reader": self._upstream_reader(),
            "client_writer": self._client_writer(),
            "idle": self._idle(),
        }
        self._tasks = {name: asyncio.ensure_future(coro) for name, coro in tasks.items()}
        finished = False
        try:
            end = await self._done
            await self._stop(*self._tasks)
            await self._finish(end)
            finished = True
            return end.label
        finally:
            await self._stop(*self._tasks)
            self.held.release_all()
            if not finished and self.upstream.transport is not None:
                self.upstream.transport.abort()  # cancelled from outside (server shutdown)

    def _end(self, label: str, client: Close | None, upstream: Close | None) -> None:
        if not self._done.done():
            self._done.set_result(End(label, client, upstream))

    async def _stop(self, *names: str) -> None:
        """Cancel the named tasks and wait for them (never the caller's own task)."""
        current = asyncio.current_task()
        tasks = [t for n in names if (t := self._tasks[n]) is not current and not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _closing(self, pipe: Pipe, close: Close) -> None:
        """A side closed: the other direction delivers what is pending, then ``close``."""
        self._flush_by = self.clock() + self.limits.send_timeout_s
        pipe.put(close)

    def _timeout(self) -> float:
        """The current write's timeout (shorter while flushing after a close)."""
        timeout = self.limits.send_timeout_s
        if self._flush_by is not None:
            timeout = max(0.0, min(timeout, self._flush_by - self.clock()))
        return timeout

    async def _read(self, data: Data, pace: Pace) -> bool:
        """Count and pace one message read; False when the relay must end instead."""
        n = message_size(data)
        if n > self.limits.max_message_bytes:
            self._end("too_big", Close(1009, "message too big"), Close(1001, ""))
            return False
        if not self.held.reserve(n):
            self._end("buffer_full", Close(1013, "try again later"), Close(1001, ""))
            return False
        now = self.clock()
        self.last_activity = now
        delay = pace.take(n, now)
        if delay > 0:
            await self.sleep(delay)
        return True

    async def _client_reader(self) -> None:
        limits = self.limits
        pace = Pace(limits.max_messages_per_s, limits.max_bytes_per_s, self.clock())
        while True:
            await self.held.room.wait()
            message = await self.receive()
            if message["type"] == "websocket.disconnect":
                code = sendable(message.get("code", 1005), vanished=1001)
                await self._stop("upstream_reader", "client_writer")  # nobody to deliver to
                self._closing(self._to_upstream, Close(code, message.get("reason") or ""))
                return
            if message["type"] != "websocket.receive":
                continue
            text = message.get("text")
            data: Data = text if text is not None else message.get("bytes") or b""
            if not await self._read(data, pace):
                return
            self._to_upstream.put(data)

    async def _upstream_writer(self) -> None:
        while True:
            item = await self._to_upstream.get()
            if isinstance(item, Close):
                self._end("client_closed", None, item)
                return
            try:
                async with asyncio.timeout(self._timeout()):
                    await self.upstream.send(item)
            except TimeoutError:
                self._end("upstream_send_timeout", Close(1011, "upstream timeout"), ABORT)
                return
            except ConnectionClosed:
                return  # the upstream reader sees the close and ends the relay
            self.held.release(message_size(item))

    async def _upstream_reader(self) -> None:
        limits = self.limits
        pace = Pace(limits.max_messages_per_s, limits.max_bytes_per_s, self.clock())
        upstream = self.upstream
        while True:
            await self.held.room.wait()
            try:
                data = await upstream.recv()
            except ConnectionClosed:
                code = sendable(upstream.close_code or 1006, vanished=1011)
                await self._stop("client_reader", "upstream_writer")
                self._closing(self._to_client, Close(code, upstream.close_reason or ""))
                return
            if not await self._read(data, pace):
                return
            self._to_client.put(data)

    async def _client_writer(self) -> None:
        while True:
            item = await self._to_client.get()
            if isinstance(item, Close):
                self._end("upstream_closed", item, None)
                return
            key = "text" if isinstance(item, str) else "bytes"
            try:
                async with asyncio.timeout(self._timeout()):
                    await self.send({"type": "websocket.send", key: item})
            except TimeoutError:
                self._end("client_send_timeout", None, Close(1001, ""))
                return
            except OSError:  # uvicorn's ClientDisconnected: the client is gone
                self._end("client_closed", None, Close(1001, ""))
                return
            self.held.release(message_size(item))

    async def _idle(self) -> None:
        idle_s = self.limits.idle_timeout_s
        while True:
            left = self.last_activity + idle_s - self.clock()
            if left <= 0:
                self._end("idle", Close(1001, "idle timeout"), Close(1001, "idle timeout"))
                return
            await self.sleep(left)

    async def _finish(self, end: End) -> None:
        """Send the end's closes (the client's bounded by ``send_timeout_ms``, the upstream's
        closing handshake by ``close_timeout_ms``, then its connection is aborted)."""
        timeout = self.limits.send_timeout_s
        if end.client is not None:
            close = {
                "type": "websocket.close",
                "code": end.client.code,
                "reason": end.client.reason,
            }
            # gone, stuck, or already closed: nothing more to tell it
            with contextlib.suppress(OSError, TimeoutError, RuntimeError):
                async with asyncio.timeout(timeout):
                    await self.send(close)
        upstream = self.upstream
        if end.upstream is ABORT:
            if upstream.transport is not None:
                upstream.transport.abort()
        elif end.upstream is not None:
            try:
                async with asyncio.timeout(self.limits.close_timeout_s):
                    await upstream.close(end.upstream.code, end.upstream.reason)
            except TimeoutError:
                upstream.transport.abort()
