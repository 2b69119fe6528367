"""Request and response bodies: read small ones, stream the rest with backpressure both ways.

Request side: a body with a ``Content-Length`` up to ``proxy.request_buffer_bytes``
is read before the upstream call (one ``receive`` in the common case); a
larger or chunked body streams upstream as it arrives (``RequestBodyStream``),
counted against ``max_body_bytes``. The declared framing comes from the one
parse of the head (``core/head.py``); the framing sent upstream is the
proxy's own: the length of a read body, or a streamed body held to exactly
its declared length (``BodyMismatch`` otherwise: never a byte more, and never
an upstream left waiting for bytes that will not come). Replaying a body for a retry is the retry
stage's job (it feeds the same ``receive`` again, bounded).

Response side (``relay``): each upstream chunk is sent before the next is read,
so a slow client pauses the upstream read (uvicorn's ``send`` waits while its
write buffer is above the high-water mark; aiohttp stops reading its socket
when its own buffer is full): at most about two buffers per response are
held. A ``send`` that does not finish within ``send_timeout_s`` (a client that
stopped reading) and an upstream failure after the head both *abort* the
client connection by raising, so a truncated body is never presented as a
complete response.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from ballast_asgi.core.types import Message, Receive, Send


class ClientGone(Exception):
    """The client disconnected while its request body was being read."""


class BodyTooLarge(Exception):
    """A streamed request body went past ``max_body_bytes``."""


class BodyMismatch(Exception):
    """The request body the server delivered is not the length its head declared."""


class UpstreamBodyError(Exception):
    """The upstream failed after the response head: the client connection is aborted."""


class ClientSendTimeout(Exception):
    """The client did not take a response chunk within the send timeout: aborted."""


async def read_body(receive: Receive, limit: int, first: Message | None = None) -> bytes | None:
    """The whole request body, or None when it is larger than ``limit``.

    ``first``: the first message, when the caller already received it.
    """
    message = await receive() if first is None else first
    if message["type"] != "http.request":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        return body if len(body) <= limit else None
    chunks = [body]
    size = len(body)
    while message.get("more_body", False):
        if size > limit:
            return None
        message = await receive()
        if message["type"] != "http.request":
            raise ClientGone
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks) if size <= limit else None


class RequestBodyStream(httpx.AsyncByteStream):
    """The client's request body, streamed upstream as it arrives (at most ``limit`` bytes).

    ``length``: the declared Content-Length, sent upstream as the framing; the
    stream then yields exactly that many bytes or raises ``BodyMismatch``
    (None: chunked, any length up to ``limit``).
    """

    __slots__ = ("_length", "_limit", "_receive", "done", "gone", "mismatch", "too_large")

    def __init__(self, receive: Receive, limit: int, length: int | None = None) -> None:
        self._receive = receive
        self._limit = limit
        self._length = length
        self.done = False
        self.gone = False
        self.too_large = False
        self.mismatch = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        more = True
        while more:
            message = await self._receive()
            if message["type"] != "http.request":
                self.gone = True
                raise ClientGone
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > self._limit:
                self.too_large = True
                raise BodyTooLarge
            more = message.get("more_body", False)
            expected = self._length
            if expected is not None and (size > expected or (not more and size < expected)):
                self.mismatch = True
                raise BodyMismatch(f"request body is not its declared {self._length} bytes")
            if chunk:
                yield chunk
        self.done = True


#: A response that has sent less than this can not block on a send: it still fits
#: below uvicorn's write-buffer high-water mark (64 KiB), so it needs no timer.
UNTIMED_BYTES = 16 * 1024


async def relay(
    chunks: AsyncIterator[bytes],
    length: int | None,
    send: Send,
    send_timeout_s: float,
    watch: Callable[[], asyncio.Future[Any] | None],
) -> bool:
    """Send the upstream body; False when the client left (the caller closes upstream).

    Raises ``UpstreamBodyError`` when the upstream fails mid-body and
    ``ClientSendTimeout`` when a send takes longer than ``send_timeout_s``
    (timed once the response is past ``UNTIMED_BYTES``: the common small
    response costs no timer). ``watch()`` starts (once) a future that
    completes when the client disconnects.
    """
    sent = 0
    finished = False
    watcher: asyncio.Future[Any] | None = None
    try:
        async for chunk in chunks:
            if finished or not chunk or length == 0:
                continue  # drain to EOF so the connection can be reused
            if watcher is not None and watcher.done():
                return False
            sent += len(chunk)
            finished = length is not None and sent >= length
            message = {"type": "http.response.body", "body": chunk, "more_body": not finished}
            if sent <= UNTIMED_BYTES:  # cannot block: no timer (the common small response)
                await send(message)
            else:
                await _send(send, message, sent, send_timeout_s)
            if watcher is None and not finished:
                watcher = watch()
        if not finished:
            if length:  # Content-Length promised more than the upstream sent
                raise UpstreamBodyError(f"upstream body ended after {sent} of {length} bytes")
            await _send(send, _END, sent, send_timeout_s)
    except httpx.TransportError as exc:
        raise UpstreamBodyError(f"upstream body failed: {type(exc).__name__}") from exc
    except OSError:
        return False
    finally:
        if watcher is not None:
            watcher.cancel()
    return True


_END = {"type": "http.response.body", "body": b"", "more_body": False}


async def _send(send: Send, message: dict[str, Any], sent: int, timeout_s: float) -> None:
    """``send(message)``, under a timeout once the response is past ``UNTIMED_BYTES``."""
    if sent <= UNTIMED_BYTES:
        await send(message)
        return
    try:
        async with asyncio.timeout(timeout_s):
            await send(message)
    except TimeoutError:
        raise ClientSendTimeout(f"client took no data for {timeout_s:g} s") from None


async def disconnected(receive: Receive) -> None:
    """Returns when the client disconnects (the request body was already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


__all__ = [
    "BodyMismatch",
    "BodyTooLarge",
    "ClientGone",
    "ClientSendTimeout",
    "RequestBodyStream",
    "UpstreamBodyError",
    "disconnected",
    "read_body",
    "relay",
]
