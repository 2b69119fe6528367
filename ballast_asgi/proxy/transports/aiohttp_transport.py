"""The proxy's aiohttp transport: one aiohttp ``ClientSession`` behind the httpx API.

(The default, ``LeanTransport`` in ``lean.py``, is this transport with a lean
direct path for plain-http requests with an in-memory body; ``make_transport``
in this package's ``__init__`` chooses between them.)

Why: httpx's own connection pool costs about 1.2-2 ms of CPU per proxied request
on the reference machine and collapses near 600-900 rps; aiohttp's holds about
7,000 rps (docs/adr/0003-fast-proxy-transport.md has the numbers). The proxy
stays an httpx user (requests, responses, exceptions, ``httpx.MockTransport``
and respx in tests); only the wire work is aiohttp's.

Proxy-correct settings: no cookie jar (``DummyCookieJar``), no automatic
decompression, no added ``User-Agent`` / ``Accept-Encoding`` / ``Accept``,
no redirects, no environment proxies, repeated headers passed as a list.

The translation between the two (URLs, timeouts, header and body forms, the
error mapping, the response stream) is ``aiohttp_adapt.py``; this module holds
the session's proxy-correct settings and the transport itself.
"""

from __future__ import annotations

import inspect
import ssl
from collections.abc import Iterable
from typing import Any

import aiohttp
import httpx
from multidict import CIMultiDict, istr
from yarl import URL

from ballast_asgi.proxy.transports.aiohttp_adapt import (
    LARGE_BODY_BYTES,
    AiohttpResponseStream,
    client_timeout,
    decode_headers,
    direct_url,
    map_error,
    request_body,
    request_headers,
    request_timeout,
    slices,
    yarl_url,
)
from ballast_asgi.proxy.transports.direct import DirectResponse
from ballast_asgi.proxy.transports.httpx_transport import httpx_transport
from ballast_asgi.proxy.transports.pool_guards import ProxyClientResponse

#: Headers aiohttp would add on its own; a proxy adds none of them.
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept-Encoding", "Accept", "Content-Type")
_HTTP_11 = {"http_version": b"HTTP/1.1"}


class _ProxyClientRequest(aiohttp.ClientRequest):
    """aiohttp's request that adds nothing the client did not send (issue 13.3).

    * no ``Content-Length: 0`` on a bodiless DELETE/POST/...: a request
      without a body goes without framing headers, as the client sent it;
    * no ``Content-Type: application/octet-stream`` (skipped via the session's
      ``skip_auto_headers``, which also skips ``Accept``, ``Accept-Encoding``
      and ``User-Agent``);
    * ``update_auto_headers`` records the session's skip set, built once,
      instead of sorting it and copying two header dicts per request, when
      the skip set is exactly ours and aiohttp's automatic headers are among
      it (checked at import): the request on the wire is identical.
    """

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        if not _LEAN_AUTO or skip_auto_headers is None or skip_auto_headers != _SKIP_FROZEN:
            super().update_auto_headers(skip_auto_headers)
            return
        self._skip_auto_headers = _SKIP_MULTIDICT

    def update_body_from_data(self, body: Any, _stacklevel: int = 3) -> None:
        if body is None:
            self._body = None
            return
        super().update_body_from_data(body, _stacklevel)


_SKIP_FROZEN = frozenset(istr(name) for name in _SKIP_AUTO_HEADERS)
#: ``ClientSession(max_headers=...)`` exists (aiohttp 3.13.4 and later).
_SESSION_MAX_HEADERS = "max_headers" in inspect.signature(aiohttp.ClientSession).parameters
_SKIP_MULTIDICT: CIMultiDict[None] = CIMultiDict((name, None) for name in sorted(_SKIP_FROZEN))
#: The lean auto-header path only when aiohttp's automatic headers are ones we skip.
_LEAN_AUTO = {istr(name) for name in aiohttp.ClientRequest.DEFAULT_HEADERS} | {
    istr("User-Agent")
} <= _SKIP_FROZEN


def _no_hidden_retry(session: aiohttp.ClientSession) -> None:
    """Turn off aiohttp's silent second try of an idempotent request after a reset.

    aiohttp (3.9+) resends GET/HEAD/OPTIONS/PUT/DELETE once on
    ``ServerDisconnectedError``/``ClientOSError`` without telling anyone, so
    one request with ``max_attempts: 3`` cost 6 upstream attempts (issue
    11.7). Every attempt must be one the retry stage chose and counted. There
    is no public switch; the private flag is checked here so that a rename
    fails loudly (tests/e2e/test_proxy_attempts.py counts attempts at a
    resetting upstream).
    """
    if not hasattr(session, "_retry_connection"):
        raise RuntimeError("aiohttp changed: cannot disable its idempotent-request retry")
    session._retry_connection = False


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport over one lazily created ``aiohttp.ClientSession``.

    ``handle_async_request`` is the httpx seam; ``send_direct`` is the same
    exchange for the proxy's common case (a body already in memory, UTF-8
    header values) without building ``httpx.Request``/``Response``/``URL``
    objects (issue 18 item 4): same wire bytes, same error mapping.
    """

    def __init__(
        self,
        *,
        max_connections: int = 1_000,
        keepalive_s: float = 1.5,
        max_field_size: int = 65_536,
        max_headers: int = 100,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self.max_field_size = max_field_size
        #: Header fields per response head (more: a protocol error; the proxy checks it too).
        self.max_headers = max_headers
        #: Verification for https upstreams (None: aiohttp's default, verified).
        self.ssl_context = ssl_context
        self._session: aiohttp.ClientSession | None = None
        self._fallback: httpx.AsyncHTTPTransport | None = None

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            limit_per_host=0,
            keepalive_timeout=self.keepalive_s,
            ttl_dns_cache=60,
            ssl=self.ssl_context if self.ssl_context is not None else True,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO_HEADERS,
            trust_env=False,
            timeout=aiohttp.ClientTimeout(total=None),
            max_field_size=self.max_field_size,
            max_line_size=self.max_field_size,
            **self._header_count(),
            request_class=_ProxyClientRequest,
            response_class=ProxyClientResponse,
        )
        _no_hidden_retry(self._session)
        return self._session

    def _header_count(self) -> dict[str, Any]:
        """aiohttp's own bound on response header fields (``max_headers``, aiohttp >= 3.13.4);
        older versions have none to set, and the proxy's check still applies."""
        return {"max_headers": self.max_headers} if _SESSION_MAX_HEADERS else {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` through aiohttp and return a streaming httpx response."""
        headers = request_headers(request)
        if headers is None:  # not UTF-8: aiohttp would re-encode it
            return await self._bytes_transport().handle_async_request(request)
        session = self._session
        if session is None or session.closed:
            session = self._open()
        try:
            response = await session.request(
                request.method,
                yarl_url(request.url),
                headers=headers,
                data=request_body(request),
                allow_redirects=False,
                timeout=request_timeout(request.extensions),
                compress=None,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise map_error(exc, request) from exc
        return httpx.Response(
            response.status,
            headers=list(response.raw_headers),
            stream=AiohttpResponseStream(response, request),
            extensions=_HTTP_11,
            request=request,
        )

    async def send_direct(
        self,
        method: str,
        url: URL,
        headers: list[tuple[str, str]],
        body: bytes,
        limits: aiohttp.ClientTimeout,
    ) -> DirectResponse:
        """Send one request with an in-memory ``body``; errors raised as httpx's.

        ``headers`` are decoded as ``request_headers`` does (the caller falls back to
        the httpx seam when a value is not UTF-8).
        """
        session = self._session
        if session is None or session.closed:
            session = self._open()
        try:
            response = await session.request(
                method,
                url,
                headers=headers,
                data=slices(body) if len(body) > LARGE_BODY_BYTES else (body or None),
                allow_redirects=False,
                timeout=limits,
                compress=None,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise map_error(exc, None) from exc
        stream = AiohttpResponseStream(response, None)
        return DirectResponse(response.status, list(response.raw_headers), stream)

    def _bytes_transport(self) -> httpx.AsyncHTTPTransport:
        """httpx's own pool, for the rare request whose header bytes aiohttp cannot keep."""
        if self._fallback is None:
            context = self.ssl_context if self.ssl_context is not None else True
            self._fallback = httpx_transport(self.max_connections, self.keepalive_s, context)
        return self._fallback

    async def aclose(self) -> None:
        """Close the session, the fallback pool and their connections."""
        session, self._session = self._session, None
        fallback, self._fallback = self._fallback, None
        if session is not None and not session.closed:
            await session.close()
        if fallback is not None:
            await fallback.aclose()


__all__ = [
    "AiohttpResponseStream",
    "AiohttpTransport",
    "client_timeout",
    "decode_headers",
    "direct_url",
    "map_error",
    "yarl_url",
]
