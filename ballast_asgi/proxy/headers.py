"""Header and URL rewriting for the proxy, on raw ASGI header lists (no dicts, one pass).

Hop-by-hop headers (RFC 9110 section 7.6.1) are removed in both directions:
``Connection`` and every header it names, ``Keep-Alive``, ``TE``,
``Trailer``, ``Transfer-Encoding``, ``Upgrade`` and ``Proxy-*``.

Request side, in addition: the client's ``Content-Length`` is dropped like
``Transfer-Encoding``: the framing sent upstream is always the gateway's own,
written by the proxy from the bytes it forwards (issue 27: a client must
never frame, or un-frame, what the upstream parses). A ``Connection`` token
naming a header in ``PROTECTED`` (framing, routing, and what the gateway
writes itself) is ignored, as nginx ignores them; other named headers are
removed (RFC 9110 section 7.6.1). ``Expect`` is dropped (the gateway answered
``100-continue`` itself when it read the body; an upstream that never sends 100
must not hold the request); ``Host`` is dropped (httpx sets the upstream's) and
sent on as ``X-Forwarded-Host``; ``X-Forwarded-For`` gets the client address
appended to any earlier values (joined into one header, as nginx's
``$proxy_add_x_forwarded_for``); ``X-Forwarded-Proto`` is replaced by the
scope's scheme; ``X-Deadline-Ms`` is replaced when the gateway computed the
remaining budget.

Response side, in addition (``response_headers``): a head the gateway cannot
relay faithfully is refused (``BadResponseHead``, answered 502 by the proxy):
more fields or bytes than ``proxy.max_response_headers`` /
``proxy.max_response_head_bytes``, a Content-Length that is not one run of
digits, a Transfer-Encoding other than one ``chunked``, both at once, or a
control character other than HTAB in a value. An upstream's ``Connection``
tokens naming a ``PROTECTED`` header are ignored as a client's are: the length
the upstream framed its body with stays the length the client is told.
"""

from __future__ import annotations

import re
from urllib.parse import quote_from_bytes

from ballast_asgi.core.types import RawHeaders, Scope

HOP_BY_HOP = frozenset(
    {b"connection", b"keep-alive", b"te", b"trailer", b"transfer-encoding", b"upgrade"}
)
#: Headers no ``Connection`` token (a client's or an upstream's) removes: framing, routing and the
#: headers the gateway writes or normalises itself (its decisions must reach the upstream).
PROTECTED = frozenset(
    {
        b"content-length",
        b"transfer-encoding",
        b"host",
        b"x-forwarded-for",
        b"x-forwarded-proto",
        b"x-forwarded-host",
        b"x-priority",
        b"x-deadline-ms",
    }
)
_REQUEST_DROP = HOP_BY_HOP | {
    b"content-length",
    b"host",
    b"expect",
    b"x-forwarded-for",
    b"x-forwarded-proto",
    b"x-forwarded-host",
}
DEADLINE = b"x-deadline-ms"
_LOCATIONS = frozenset({b"location", b"content-location"})
#: Printable ASCII stays as it is (existing %XX escapes included); other bytes are escaped.
_SAFE = bytes(range(0x21, 0x7F))


def connection_names(
    value: bytes, into: set[bytes] | None, keep: frozenset[bytes] = frozenset()
) -> set[bytes]:
    """Add the header names listed in one ``Connection`` value to ``into`` (except ``keep``)."""
    names = into if into is not None else set()
    for token in value.split(b","):
        token = token.strip().lower()
        if token and token not in keep:
            names.add(token)
    return names


_SCHEMES = {"http": b"http", "https": b"https"}


def request_headers(scope: Scope, drop_deadline: bool) -> RawHeaders:
    """The headers to send upstream for ``scope`` (without Host and framing; the caller adds them).

    ``drop_deadline``: the gateway computed the remaining budget and will send
    its own ``X-Deadline-Ms``.
    """
    out: RawHeaders = []
    host = forwarded_for = named = None
    for name, value in scope["headers"]:
        if name in _REQUEST_DROP:
            if name == b"host":
                host = value
            elif name == b"x-forwarded-for":
                forwarded_for = value if forwarded_for is None else forwarded_for + b", " + value
            elif name == b"connection" and value.lower() not in HOP_BY_HOP:
                named = connection_names(value, named, PROTECTED)  # (one hop-by-hop token:
                # it names a header dropped anyway, e.g. ``keep-alive``; nothing to filter)
        elif not name.startswith(b"proxy-") and not (drop_deadline and name == DEADLINE):
            out.append((name, value))
    if named:
        out = [h for h in out if h[0] not in named]
    client = scope.get("client")
    if client:
        ip = client[0].encode("latin-1")
        forwarded_for = ip if forwarded_for is None else forwarded_for + b", " + ip
    if forwarded_for is not None:
        out.append((b"x-forwarded-for", forwarded_for))
    scheme = scope.get("scheme", "http")
    out.append((b"x-forwarded-proto", _SCHEMES.get(scheme) or scheme.encode("latin-1")))
    if host is not None:
        out.append((b"x-forwarded-host", host))
    return out


#: How ``response_headers`` treats a header name, as the upstream spelled it.
_KEEP, _HOP, _CONNECTION, _LENGTH, _LOCATION, _CODING = range(6)
#: Name as received -> (lower-cased name, treatment); bounded (an upstream picks the names).
_NAMES: dict[bytes, tuple[bytes, int]] = {}
_NAMES_MAX = 1024
#: The names of ``_NAMES`` treated ``_KEEP`` -> lower-cased (the loop's shortcut).
_KEPT: dict[bytes, bytes] = {}
#: The one transfer coding the gateway decodes (RFC 9112 section 6.1; nginx's rule).
_CHUNKED = b"chunked"
#: Control characters a field value may not hold (RFC 9110 5.5; uvicorn raises on them).
_CTL = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


class BadResponseHead(Exception):
    """The upstream's response head breaks a framing rule or a limit: refused with 502."""


def _name(name: bytes) -> tuple[bytes, int]:
    """The lower-cased name and its treatment (cached: upstreams repeat their names)."""
    lname = name.lower()
    if lname == b"connection":
        kind = _CONNECTION
    elif lname == b"transfer-encoding":
        kind = _CODING
    elif lname in HOP_BY_HOP or lname.startswith(b"proxy-"):
        kind = _HOP
    elif lname == b"content-length":
        kind = _LENGTH
    elif lname in _LOCATIONS:
        kind = _LOCATION
    else:
        kind = _KEEP
    if len(_NAMES) < _NAMES_MAX:
        _NAMES[name] = (lname, kind)
        if kind == _KEEP:
            _KEPT[name] = lname
    return lname, kind


def response_headers(
    raw: RawHeaders, max_headers: int = 0, max_bytes: int = 0, controls: bool = False
) -> tuple[RawHeaders, int | None, bool]:
    """Upstream response headers without hop-by-hop ones, the Content-Length if any, and
    whether a ``Location``/``Content-Location`` is among them (for ``redirects.py``).

    Raises ``BadResponseHead`` (the proxy answers 502, nothing of the head is
    sent) for more than ``max_headers`` fields or ``max_bytes`` bytes of names
    and values (0: no limit), a ``Content-Length`` that is not one run of
    digits or comes twice, a ``Transfer-Encoding`` other than one ``chunked``
    (``chunked, gzip``, ``gzip``, ``identity``, ``chunked`` twice: a coding
    the gateway would not decode), and both framing headers at once; with
    ``controls``, also a value holding a control character other than HTAB
    (uvicorn would raise on it and drop the client connection; the lean
    transport's parser refuses them itself, aiohttp's and h11 pass them on).
    """
    if max_headers and len(raw) > max_headers:
        raise BadResponseHead(f"upstream sent {len(raw)} header fields (limit {max_headers})")
    out: RawHeaders = []
    named: set[bytes] | None = None
    length: int | None = None
    coding: bytes | None = None
    location = False
    size = 0
    names = _NAMES
    kept = _KEPT
    for name, value in raw:
        size += len(name) + len(value)
        if controls and _CTL.search(value) is not None:
            raise BadResponseHead("upstream sent a control character in a header value")
        lname = kept.get(name)  # the common case: a name passed on as it is, lower-cased
        if lname is not None:
            out.append((lname, value))
            continue
        lname, kind = names.get(name) or _name(name)
        if kind == _KEEP:
            out.append((lname, value))
            continue
        if kind == _HOP:
            continue
        if kind == _CONNECTION:
            if value.lower() not in HOP_BY_HOP:  # one token naming a dropped header: no-op
                named = connection_names(value, named, PROTECTED)
            continue
        if kind == _CODING:
            coding = value if coding is None else coding + b"," + value
            continue
        if kind == _LENGTH:
            if length is not None or not value.isdigit():
                raise BadResponseHead("upstream sent an invalid or repeated Content-Length")
            length = int(value)
        else:
            location = True
        out.append((lname, value))
    if max_bytes and size > max_bytes:
        raise BadResponseHead(f"upstream sent too big header ({size} bytes, limit {max_bytes})")
    if coding is not None:
        if coding.strip(b" \t").lower() != _CHUNKED:
            raise BadResponseHead("upstream sent an unknown Transfer-Encoding")
        if length is not None:
            raise BadResponseHead("upstream sent both Content-Length and Transfer-Encoding")
    if named:
        out = [h for h in out if h[0] not in named]
    return out, length, location


#: No content, whatever the head says (RFC 9110 sections 15.3.5 and 15.4.5).
_NO_CONTENT = (204, 304)


def response_head(
    status: int, raw: RawHeaders, max_headers: int = 0, max_bytes: int = 0, controls: bool = True
) -> tuple[RawHeaders, int | None, bool]:
    """``response_headers`` for a final response with status ``status``, checked first.

    A status outside 200-599 is refused (``BadResponseHead``): interim 1xx
    responses never get here (every transport skips them; ``101`` is never
    asked for on this path) and anything else is not HTTP. A 204 or 304 loses
    a non-zero Content-Length (a 304's is the representation's length): it
    has no content, and uvicorn would wait for the bytes the length announces
    and then break the client connection (``0`` is kept: nothing to wait for).
    """
    if not 200 <= status <= 599:
        raise BadResponseHead(f"upstream sent status {status}")
    headers, length, location = response_headers(raw, max_headers, max_bytes, controls)
    if length and status in _NO_CONTENT:
        headers = [h for h in headers if h[0] != b"content-length"]
        length = 0
    return headers, length, location


def origin_form(scope: Scope) -> bool:
    """Whether the request target is origin-form (``/path``); anything else gets a 400.

    uvicorn passes targets such as ``*``, ``*@host:port/x`` or (h11)
    ``http://host/x`` through as the path. None of them is ever proxied.
    """
    raw = scope.get("raw_path")
    path: str = scope.get("path", "")
    return path.startswith("/") and (not raw or raw.startswith(b"/"))


def raw_target(scope: Scope) -> bytes:
    """The target (path relative to root_path, and query) as printable ASCII.

    The path is empty when the request is for the mount point itself (the
    upstream's base path is used as it is).
    """
    raw = scope.get("raw_path")
    if raw and type(raw) is bytes and not scope.get("root_path"):
        target = raw  # not mounted: the raw path as it is (what ``_relative_path`` returns)
    else:
        target = _relative_path(scope)
    query: bytes = scope.get("query_string", b"")
    if query:
        target = target + b"?" + query
    if target.translate(None, _SAFE):
        target = quote_from_bytes(target, safe=_SAFE).encode("ascii")
    return target


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
