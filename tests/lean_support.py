"""A raw upstream on 127.0.0.1 for the lean transport's tests: scripted answers, counted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import ClientTimeout

from ballast_asgi.proxy.transports.aiohttp_transport import client_timeout
from ballast_asgi.proxy.transports.direct import DirectResponse
from ballast_asgi.proxy.transports.lean import LeanTransport
from ballast_asgi.proxy.upstream import Upstream

Handler = Callable[["Raw", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
DEFAULT_LIMITS = client_timeout({"connect": 2.0, "read": 5.0, "write": 5.0, "pool": 5.0})


class Raw:
    """What the upstream saw: connections opened and every request head read."""

    def __init__(self) -> None:
        self.connections = 0
        self.heads: list[bytes] = []

    async def head(self, reader: asyncio.StreamReader) -> bytes | None:
        """The next request head on this connection, or None at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        self.heads.append(head)
        return head


@asynccontextmanager
async def raw_upstream(handler: Handler) -> AsyncIterator[tuple[Raw, Upstream]]:
    """A TCP server running ``handler(raw, reader, writer)`` per connection."""
    raw = Raw()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw.connections += 1
        try:
            await handler(raw, reader, writer)
        finally:
            writer.close()

    srv = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        yield raw, Upstream.parse(f"http://127.0.0.1:{port}")
    finally:
        srv.close()
        await srv.wait_closed()


def answering(*answers: bytes) -> Handler:
    """A keep-alive handler that sends the next of ``answers`` per request (then stops)."""
    queue = list(answers)

    async def handler(raw: Raw, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while queue and await raw.head(reader) is not None:
            writer.write(queue.pop(0))
            await writer.drain()
        await reader.read()  # until the client closes

    return handler


async def get(
    transport: LeanTransport,
    upstream: Upstream,
    method: str = "GET",
    limits: ClientTimeout = DEFAULT_LIMITS,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> DirectResponse:
    """One lean exchange up to the head."""
    call = transport.send_lean(
        method, upstream, b"/p?q=1", [(b"host", upstream.netloc), *(headers or [])], body, limits
    )
    assert call is not None
    return await call


async def body_of(response: DirectResponse) -> bytes:
    """The whole body, then the response closed."""
    try:
        return b"".join([chunk async for chunk in response.stream])
    finally:
        await response.aclose()


__all__ = ["DEFAULT_LIMITS", "Raw", "answering", "body_of", "get", "raw_upstream"]
