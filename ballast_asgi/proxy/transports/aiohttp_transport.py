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

Timeouts come from ``request.extensions["timeout"]`` (httpx's
``{"connect", "read", "write", "pool"}`` in seconds): ``pool + connect`` bounds
getting a connection, ``read`` bounds each socket read. aiohttp's errors are
mapped to httpx's, so that the proxy translates failures in one place:

==========================================  ==============================
aiohttp                                     httpx
==========================================  ==============================
ConnectionTimeoutError                      ConnectTimeout
any other TimeoutError                      ReadTimeout
ClientConnectorError (refused, DNS, ...)    ConnectError
ServerDisconnectedError, ClientPayloadError RemoteProtocolError
ClientResponseError (bad status line, ...)  RemoteProtocolError
ClientOSError (reset, broken pipe)          ReadError
any other aiohttp.ClientError               RemoteProtocolError
==========================================  ==============================
"""

from __future__ import annotations

import inspect
import ssl
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

import aiohttp
import httpx
from multidict import CIMultiDict, istr
from yarl import URL

from ballast_asgi.proxy.transports.direct import DirectResponse
from ballast_asgi.proxy.transports.httpx_transport import httpx_transport
from ballast_asgi.proxy.transports.pool_guards import ProxyClientResponse
from ballast_asgi.proxy.upstream import Upstream

#: Headers aiohttp would add on its own; a proxy adds none of them.
_SKIP_AUTO_HEADERS = ("User-Agent", "Accept-Encoding", "Accept", "Content-Type")
_HTTP_11 = {"http_version": b"HTTP/1.1"}
_LARGE_BODY_BYTES = 1 << 20
_SLICE_BYTES = 256 * 1024


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


def map_error(exc: BaseException, request: httpx.Request | None) -> httpx.TransportError:
    """The httpx exception that stands for an aiohttp (or socket) failure."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message, request=request)
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message, request=request)
    if isinstance(exc, aiohttp.ClientOSError | ConnectionError):
        return httpx.ReadError(message, request=request)
    return httpx.RemoteProtocolError(message, request=request)


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


def yarl_url(url: httpx.URL) -> URL:
    """aiohttp's URL built from the parts of httpx's (never by re-parsing a string).

    Scheme, host and port come from the parsed upstream; the path must be
    origin-form, so no target can move the request to another host.
    """
    path = url.raw_path
    if not path.startswith(b"/"):
        raise ValueError("request target is not origin-form")  # the proxy refused it already
    return _build(url.scheme, url.raw_host.decode("ascii"), url.port, path.decode("ascii"))


def direct_url(upstream: Upstream, target: bytes) -> URL:
    """aiohttp's URL for ``target`` at ``upstream`` without an ``httpx.URL`` in between.

    The same URL as ``yarl_url(upstream.url(target))``: scheme, host and port
    from the parsed upstream, ``base_path + target`` as path and query.
    """
    if target[:1] not in (b"/", b"?", b""):
        raise ValueError("request target is not origin-form")
    path = (upstream.base_path + target).decode("ascii")
    if not path.startswith("/"):
        path = "/" + path
    return _build(upstream.scheme, upstream.host, upstream.port, path)


def _build(scheme: str, host: str, port: int | None, path_qs: str) -> URL:
    raw, _, query = path_qs.partition("?")
    return URL.build(
        scheme=scheme,
        host=f"[{host}]" if ":" in host else host,
        port=port,
        path=raw,
        query_string=query,
        encoded=True,
    )


def _timeout(extensions: Mapping[str, object]) -> aiohttp.ClientTimeout:
    """aiohttp's per-request timeout from httpx's ``timeout`` extension."""
    t = extensions.get("timeout")
    if not isinstance(t, dict):
        return aiohttp.ClientTimeout(total=None)
    return client_timeout(t)


def client_timeout(t: Mapping[str, float | None]) -> aiohttp.ClientTimeout:
    """aiohttp's timeout from httpx's ``{"connect", "read", "write", "pool"}`` (+ ``total``)."""
    connect, pool, read = t.get("connect"), t.get("pool"), t.get("read")
    acquire = None if connect is None else connect + (pool or 0.0)
    total = t.get("total")  # the request's deadline: bounds the whole exchange, body included
    if total is not None and read is not None and read >= total:
        read = None  # the total fires first; a per-read timer would be re-armed per chunk
    return aiohttp.ClientTimeout(total=total, connect=acquire, sock_connect=connect, sock_read=read)


class AiohttpResponseStream(httpx.AsyncByteStream):
    """The raw (undecoded) body of an aiohttp response; releases it on close."""

    __slots__ = ("_done", "_request", "_response")

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request | None) -> None:
        self._response = response
        self._request = request
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        content = self._response.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    break
                yield chunk
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self._response.close()
            raise map_error(exc, self._request) from exc
        self._done = True

    def arrived(self, length: int) -> bytes | None:
        """The whole body if all ``length`` bytes have already arrived with the head, else None.

        A small response usually comes in the same read as its head; taking it
        at once spares the per-chunk iteration (and the connection goes back to
        the pool on ``aclose`` as after a full read).
        """
        content = self._response.content
        if self._done or not content.is_eof() or content.total_bytes != length:
            return None
        self._done = True  # nothing was read yet: the buffer holds exactly ``length`` bytes
        return content.read_nowait(-1)

    async def aclose(self) -> None:
        """Return the connection to the pool, or close it when the body was not read."""
        if self._done:
            self._response.release()
        else:
            self._response.close()


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
        headers = _headers(request)
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
                data=_body(request),
                allow_redirects=False,
                timeout=_timeout(request.extensions),
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

        ``headers`` are decoded as ``_headers`` does (the caller falls back to
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
                data=_slices(body) if len(body) > _LARGE_BODY_BYTES else (body or None),
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


def decode_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]] | None:
    """Raw header pairs as aiohttp takes them; None when a value is not UTF-8."""
    try:
        return [(k.decode("ascii"), v.decode("utf-8")) for k, v in raw]
    except UnicodeDecodeError:
        return None


def _headers(request: httpx.Request) -> list[tuple[str, str]] | None:
    """The request's headers as aiohttp takes them (a list keeps repeats); None if not UTF-8.

    aiohttp writes header text as UTF-8, so a value decoded as UTF-8 goes out
    byte for byte; a value that is not UTF-8 (``caf\\xe9`` in Latin-1) cannot,
    and the request goes through httpx's pool instead (issue 13.2). The
    transfer-encoding of a streamed body is aiohttp's to write.
    """
    out = decode_headers(request.headers.raw)
    if out is None or isinstance(request.stream, httpx.ByteStream):
        return out
    return [(k, v) for k, v in out if k.lower() != "transfer-encoding"]


def _body(request: httpx.Request) -> bytes | AsyncIterator[bytes] | None:
    """The request body: bytes when httpx has it in memory, else its stream.

    Bodies over 1 MiB go as 256 KiB slices (aiohttp warns that one large
    bytes write may block the loop); the Content-Length httpx set keeps the
    framing identical.
    """
    try:
        content = request.content
    except httpx.RequestNotRead:
        return _aiter(request.stream)
    if len(content) > _LARGE_BODY_BYTES:
        return _slices(content)
    return content or None


async def _slices(content: bytes) -> AsyncIterator[bytes]:
    view = memoryview(content)
    for start in range(0, len(view), _SLICE_BYTES):
        yield bytes(view[start : start + _SLICE_BYTES])


async def _aiter(stream: object) -> AsyncIterator[bytes]:
    if not isinstance(stream, httpx.AsyncByteStream):
        raise TypeError("a streaming request body must be an httpx.AsyncByteStream")
    async for chunk in stream:
        yield chunk


__all__ = [
    "AiohttpResponseStream",
    "AiohttpTransport",
    "client_timeout",
    "decode_headers",
    "direct_url",
    "map_error",
]
