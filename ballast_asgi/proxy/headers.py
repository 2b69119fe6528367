"""Header and URL rewriting for the proxy, on raw ASGI header lists (no dicts, one pass).

Hop-by-hop headers (RFC 9110 section 7.6.1) are removed in both directions:
``Connection`` and every header it names, ``Keep-Alive``, ``TE``,
``Trailer``, ``Transfer-Encoding``, ``Upgrade`` and ``Proxy-*``.

Request side, in addition: ``Host`` is dropped (httpx sets the upstream's) and
sent on as ``X-Forwarded-Host``; ``X-Forwarded-For`` gets the client address
appended to any earlier values (joined into one header, as nginx's
``$proxy_add_x_forwarded_for``); ``X-Forwarded-Proto`` is replaced by the
scope's scheme; ``X-Deadline-Ms`` is replaced when the gateway computed the
remaining budget.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote_from_bytes

import httpx

from ballast_asgi.core.types import RawHeaders, Scope

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
_REQUEST_DROP = HOP_BY_HOP | {
    b"host",
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
}
_DEADLINE = b"x-deadline-ms"
#: Printable ASCII stays as it is (existing %XX escapes included); other bytes are escaped.
_SAFE = bytes(range(0x21, 0x7F))


def connection_names(value: bytes, into: set[bytes] | None) -> set[bytes]:
    """Add the header names listed in one ``Connection`` value to ``into``."""
    names = into if into is not None else set()
    for token in value.split(b","):
        token = token.strip().lower()
        if token:
            names.add(token)
    return names


def request_headers(scope: Scope, deadline_ms: bytes | None) -> RawHeaders:
    """The headers to send upstream for a request with ``scope``."""
    out: RawHeaders = []
    host = forwarded_for = named = None
    for name, value in scope["headers"]:
        if name in _REQUEST_DROP:
            if name == b"host":
                host = value
            elif name == b"x-forwarded-for":
                forwarded_for = value if forwarded_for is None else forwarded_for + b", " + value
            elif name == b"connection":
                named = connection_names(value, named)
        elif not name.startswith(b"proxy-") and not (deadline_ms and name == _DEADLINE):
            out.append((name, value))
    if named:
        out = [h for h in out if h[0] not in named]
    client = scope.get("client")
    if client:
        ip = client[0].encode("latin-1")
        forwarded_for = ip if forwarded_for is None else forwarded_for + b", " + ip
    if forwarded_for is not None:
        out.append((b"x-forwarded-for", forwarded_for))
    out.append((b"x-forwarded-proto", scope.get("scheme", "http").encode("latin-1")))
    if host is not None:
        out.append((b"x-forwarded-host", host))
    if deadline_ms:
        out.append((_DEADLINE, deadline_ms))
    return out


def response_headers(raw: RawHeaders) -> tuple[RawHeaders, int | None]:
    """Upstream response headers without hop-by-hop ones, and the Content-Length if any."""
    out: RawHeaders = []
    named: set[bytes] | None = None
    length: int | None = None
    for name, value in raw:
        lname = name.lower()
        if lname in HOP_BY_HOP or lname.startswith(b"proxy-"):
            if lname == b"connection":
                named = connection_names(value, named)
            continue
        if lname == b"content-length" and value.isdigit():
            length = int(value)
        out.append((lname, value))
    if named:
        out = [h for h in out if h[0] not in named]
        if b"content-length" in named:
            length = None
    return out, length


class Target:
    """Builds the upstream URL for a scope: upstream base path + path relative to root_path."""

    def __init__(self, upstream: httpx.URL) -> None:
        self.origin = f"{upstream.scheme}://{upstream.netloc.decode('ascii')}"
        self.base_path = upstream.raw_path.split(b"?", 1)[0].rstrip(b"/")
        self._ref = _parsed(httpx.URL(self.origin))

    def raw_target(self, scope: Scope) -> bytes:
        """The request target (path and query) to send upstream, as ASCII bytes."""
        path = _relative_path(scope)
        target = self.base_path + path if path else (self.base_path or b"/")
        query: bytes = scope.get("query_string", b"")
        if query:
            target = target + b"?" + query
        if not target.isascii() or b" " in target:
            target = quote_from_bytes(target, safe=_SAFE).encode("ascii")
        return target

    def url(self, scope: Scope) -> httpx.URL:
        """The full upstream URL for ``scope``.

        Fast path: the target is already an ASCII, percent-encoded request
        target, so it replaces the path and query of the pre-parsed origin
        instead of going through httpx's URL parser (1.8 us instead of 14 us,
        and the target goes upstream exactly as the client sent it). Falls back
        to the public parser if httpx's internals ever change shape.
        """
        target = self.raw_target(scope).decode("ascii")
        if self._ref is None:
            return httpx.URL(self.origin + target)
        path, sep, query = target.partition("?")
        url = httpx.URL.__new__(httpx.URL)
        url._uri_reference = self._ref._replace(path=path, query=query if sep else None)
        return url


def _parsed(url: httpx.URL) -> Any:
    """httpx's parsed form of ``url`` when it is the NamedTuple we expect, else None."""
    ref = getattr(url, "_uri_reference", None)
    fields = getattr(ref, "_fields", ())
    return ref if "path" in fields and "query" in fields else None


def _relative_path(scope: Scope) -> bytes:
    """The raw path with the mount prefix (``root_path``) removed, as Starlette routes it."""
    raw = scope.get("raw_path")
    path: str = scope["path"]
    if not raw:
        raw = quote_from_bytes(path.encode("utf-8"), safe=_SAFE).encode("ascii")
    root: str = scope.get("root_path", "")
    if not root or not path.startswith(root):
        return bytes(raw)
    prefix = root.encode("utf-8")
    if raw.startswith(prefix) and (len(raw) == len(prefix) or raw[len(prefix)] == 0x2F):
        return bytes(raw[len(prefix) :])
    rest = path[len(root) :]
    if rest and not rest.startswith("/"):
        return bytes(raw)
    return quote_from_bytes(rest.encode("utf-8"), safe=_SAFE).encode("ascii")
