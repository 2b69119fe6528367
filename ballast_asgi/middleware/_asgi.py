"""ASGI plumbing shared by the stages (the only copies of it in the package).

* ``replay(messages, receive)``: a ``receive`` that hands out ``messages`` first,
  then reads on from the client.
* ``body_message(body)``: the single ``http.request`` message replaying a whole body.
* ``watch_disconnect(receive, on_gone)``: a task that drains ``receive`` and
  calls ``on_gone`` on ``http.disconnect`` (or a failing ``receive``), keeping
  what it read so it can be replayed.
* ``HeldResponse``: a ``send`` that either passes messages through (committed)
  or holds them, bounded, until the caller keeps (``flush``) or drops them.
* ``send_status(send, status, ...)``: a whole small response (head + body).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ballast_asgi.core.types import Message, Receive, Send

DISCONNECT: Message = {"type": "http.disconnect"}


def body_message(body: bytes) -> Message:
    """The one message that replays a complete request body."""
    return {"type": "http.request", "body": body, "more_body": False}


def replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that returns ``messages`` in order, then reads from the client."""
    if not messages:
        return receive
    pending = list(reversed(messages))

    async def replaying() -> Message:
        return pending.pop() if pending else await receive()

    return replaying


def watch_disconnect(
    receive: Receive, on_gone: Callable[[], None], kept: list[Message] | None = None
) -> asyncio.Task[None]:
    """Drain ``receive`` in a task; call ``on_gone`` when the client disconnects.

    Messages read are appended to ``kept`` (when given) so they can be replayed.
    Cancel the task when the watch is over.
    """

    async def watch() -> None:
        try:
            while True:
                message = await receive()
                if kept is not None:
                    kept.append(message)
                if message["type"] == "http.disconnect":
                    break
        except Exception:  # a failing receive means the client is unusable
            pass
        on_gone()

    task = asyncio.get_running_loop().create_task(watch())
    task.add_done_callback(_retrieve)
    return task


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


class HeldResponse:
    """A ``send`` that holds one attempt's response until it is kept or dropped.

    ``hold=False`` passes everything through (committed from the start). While
    holding, more than ``limit_bytes`` of body (or a message that is not part of
    an HTTP response) commits: what is held is flushed and the rest streams.
    ``on_bytes(n)`` is told of bytes held (positive) and given back (negative).
    """

    __slots__ = ("_held", "_limit", "_on_bytes", "_send", "committed", "size")

    def __init__(
        self,
        send: Send,
        *,
        hold: bool,
        limit_bytes: int = 0,
        on_bytes: Callable[[int], bool] | None = None,
    ) -> None:
        self._send = send
        self._limit = limit_bytes
        self._on_bytes = on_bytes
        self._held: list[Message] = []
        self.size = 0
        self.committed = not hold

    def send(self, message: Message) -> Awaitable[None]:
        """``send`` for the attempt: straight through once committed (no frame of its own)."""
        if self.committed:
            return self._send(message)
        return self._hold(message)

    async def _hold(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.body":
            n = len(message.get("body", b""))
            if self.size + n > self._limit or not self._account(n):
                self._held.append(message)
                await self.flush()
                return
            self.size += n
        elif kind != "http.response.start":
            self._held.append(message)
            await self.flush()
            return
        self._held.append(message)

    def _account(self, n: int) -> bool:
        return n == 0 or self._on_bytes is None or self._on_bytes(n)

    async def flush(self) -> None:
        """Send what is held and stream from now on (the commit point)."""
        self.committed = True
        held, self._held = self._held, []
        self.drop_bytes()
        for message in held:
            await self._send(message)

    def drop_bytes(self) -> None:
        """Give back the bytes held (the response is dropped or flushed)."""
        if self.size and self._on_bytes is not None:
            self._on_bytes(-self.size)
        self.size = 0
