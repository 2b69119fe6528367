"""httpx <-> aiohttp for the proxy's aiohttp transport: URLs, timeouts, headers, bodies, errors.

``AiohttpTransport`` (``aiohttp_transport.py``) speaks httpx to the proxy and
aiohttp to the upstream; everything that turns one form into the other lives
here: the upstream URL built from parsed parts (``yarl_url``, ``direct_url``:
never by re-parsing a string, origin-form only), the per-request timeouts, the
request's headers and body as aiohttp takes them, the raw response body as an
httpx stream (``AiohttpResponseStream``) and aiohttp's errors as httpx's.

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

from collections.abc import AsyncIterator, Mapping

import aiohttp
import httpx
from yarl import URL

from ballast_asgi.proxy.upstream import Upstream

#: Bodies over this go as slices (aiohttp warns that one large bytes write may block).
LARGE_BODY_BYTES = 1 << 20
_SLICE_BYTES = 256 * 1024


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


def request_timeout(extensions: Mapping[str, object]) -> aiohttp.ClientTimeout:
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


def decode_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[str, str]] | None:
    """Raw header pairs as aiohttp takes them; None when a value is not UTF-8."""
    try:
        return [(k.decode("ascii"), v.decode("utf-8")) for k, v in raw]
    except UnicodeDecodeError:
        return None


def request_headers(request: httpx.Request) -> list[tuple[str, str]] | None:
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


def request_body(request: httpx.Request) -> bytes | AsyncIterator[bytes] | None:
    """The request body: bytes when httpx has it in memory, else its stream.

    Bodies over 1 MiB go as 256 KiB slices (aiohttp warns that one large
    bytes write may block the loop); the Content-Length httpx set keeps the
    framing identical.
    """
    try:
        content = request.content
    except httpx.RequestNotRead:
        return _aiter(request.stream)
    if len(content) > LARGE_BODY_BYTES:
        return slices(content)
    return content or None


async def slices(content: bytes) -> AsyncIterator[bytes]:
    view = memoryview(content)
    for start in range(0, len(view), _SLICE_BYTES):
        yield bytes(view[start : start + _SLICE_BYTES])


async def _aiter(stream: object) -> AsyncIterator[bytes]:
    if not isinstance(stream, httpx.AsyncByteStream):
        raise TypeError("a streaming request body must be an httpx.AsyncByteStream")
    async for chunk in stream:
        yield chunk
