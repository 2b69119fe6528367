"""A fix for uvicorn's httptools protocol: request trailers must not become request headers.

uvicorn's httptools protocol appends every header field the parser reports to
the *same* list it already handed the app as ``scope["headers"]``; the parser
reports a chunked request's trailer fields that way too. So ``X-Priority:
critical`` sent as a trailer after the body reached the classification and
the upstream as a header (issue 11.8). The app cannot tell a trailer from a
header afterwards, so the protocol is corrected: once the header block is
complete, further fields are dropped (trailers are not passed on at all; the
ASGI HTTP spec has no request-trailer event). The h11 protocol never merged
them. ``ProxyApp.startup`` applies it; it is idempotent and only touches
uvicorn's ``HttpToolsProtocol`` class in the gateway's own process.
"""

from __future__ import annotations

from typing import Any

_FLAG = "_ballast_request_trailers_dropped"


def drop_request_trailers() -> bool:
    """Make uvicorn's httptools protocol ignore request trailer fields; False if not found."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # uvicorn or httptools not installed: nothing merges trailers
        return False
    if getattr(HttpToolsProtocol, _FLAG, False):
        return True
    needed = ("on_message_begin", "on_header", "on_headers_complete")
    if not all(callable(getattr(HttpToolsProtocol, name, None)) for name in needed):
        return False
    begin = HttpToolsProtocol.on_message_begin
    header = HttpToolsProtocol.on_header
    complete = HttpToolsProtocol.on_headers_complete

    def on_message_begin(self: Any) -> None:
        self._ballast_in_body = False
        begin(self)

    def on_header(self: Any, name: bytes, value: bytes) -> None:
        if not getattr(self, "_ballast_in_body", False):
            header(self, name, value)

    def on_headers_complete(self: Any) -> None:
        self._ballast_in_body = True
        complete(self)

    HttpToolsProtocol.on_message_begin = on_message_begin  # type: ignore[method-assign]
    HttpToolsProtocol.on_header = on_header  # type: ignore[method-assign]
    HttpToolsProtocol.on_headers_complete = on_headers_complete  # type: ignore[method-assign]
    setattr(HttpToolsProtocol, _FLAG, True)
    return True


__all__ = ["drop_request_trailers"]
