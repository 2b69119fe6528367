"""The proxy's shared upstream client: one httpx client over one transport, opened once.

Created on first use or at ``lifespan.startup`` (``startup``), closed at
shutdown (``aclose``); both idempotent. The transport is the injected one
(tests: ``httpx.MockTransport``) or ``proxy.transports.make_transport``'s. On
our own aiohttp (or lean) transport an in-memory body skips the httpx objects
(``direct``, see ``calls.py``), and aiohttp bounds the whole exchange by the
deadline itself (``bounds_total``). The client follows no redirects, reads no
environment, sends no default header and keeps no cookie.
"""

from __future__ import annotations

from typing import Any

import httpx

from ballast_asgi.config import ProxyConfig
from ballast_asgi.core.types import Receive, Send
from ballast_asgi.proxy.transports import AiohttpTransport, make_transport


class SharedClient:
    """The one upstream client of a ``ProxyApp``."""

    def __init__(self, config: ProxyConfig, transport: httpx.AsyncBaseTransport | None) -> None:
        self._config = config
        self._injected = transport
        #: aiohttp bounds the whole exchange by the deadline (``total``); any other
        #: transport gets an asyncio timeout around the wait for the head.
        self.bounds_total = False
        #: Our aiohttp (or lean) transport: in-memory bodies skip the httpx objects.
        self.direct: AiohttpTransport | None = None
        self._client: httpx.AsyncClient | None = None
        self._transport: httpx.AsyncBaseTransport | None = None

    @property
    def is_open(self) -> bool:
        """Whether the client exists (until ``aclose``)."""
        return self._client is not None

    @property
    def client(self) -> httpx.AsyncClient:
        """The shared client (created on first use when lifespan never ran)."""
        if self._client is None:
            self._open()
        assert self._client is not None
        return self._client

    def _open(self) -> None:
        transport = self._injected or make_transport(self._config)
        self.bounds_total = isinstance(transport, AiohttpTransport)
        self.direct = transport if isinstance(transport, AiohttpTransport) else None
        self._client = httpx.AsyncClient(
            transport=transport,
            follow_redirects=False,
            trust_env=False,
            cookies=_refuse_cookies(),
        )
        for name in list(self._client.headers):
            del self._client.headers[name]
        self._transport = transport

    async def startup(self) -> None:
        """Create the shared client (idempotent)."""
        if self._client is None:
            self._open()

    async def aclose(self) -> None:
        """Close the shared client and its transport (idempotent)."""
        client, self._client, self._transport = self._client, None, None
        self.direct = None
        if client is not None:
            await client.aclose()

    async def lifespan(self, receive: Receive, send: Send) -> None:
        """Serve the lifespan protocol: open at startup, close at shutdown."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def send_httpx(self, request: httpx.Request) -> httpx.Response:
        """``request`` through the transport (opened first if needed)."""
        transport = self._transport
        if transport is None:
            await self.startup()
            transport = self._transport
            assert transport is not None
        return await transport.handle_async_request(request)


def _refuse_cookies() -> Any:
    from http.cookiejar import CookieJar

    class _RefusingJar(CookieJar):
        def extract_cookies(self, response: Any, request: Any) -> None:
            return None

        def set_cookie(self, cookie: Any) -> None:
            return None

    return _RefusingJar()


__all__ = ["SharedClient"]
