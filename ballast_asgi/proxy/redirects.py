"""Redirects that point past the gateway are rewritten to point at it (issue 13.7).

The gateway sends the upstream's own ``Host`` by default (virtual hosts, TLS
names and absolute links generated for the upstream keep working), so an
upstream that redirects builds ``Location: http://<upstream>/<base>/next``.
Like nginx's ``proxy_redirect default``, a ``Location`` (and
``Content-Location``) that starts with the upstream's origin and base path is
rewritten to the address the client used: its scheme, its ``Host`` and the
mount point (``root_path``). A relative ``Location`` under the base path gets
the same prefix swap. Anything else (another host, a relative path outside
the base) is left alone.

``proxy.preserve_host: true`` sends the client's ``Host`` upstream instead;
the upstream then builds links to the gateway itself and nothing is rewritten.
"""

from __future__ import annotations

from ballast_asgi.core.types import RawHeaders, Scope
from ballast_asgi.proxy.upstream import Upstream

_REWRITTEN = (b"location", b"content-location")


def client_host(scope: Scope, host: bytes | None) -> bytes | None:
    """``host``, the ``Host`` the client sent (``RequestHead.host``), else the server
    address; None when unknown."""
    if host is not None:
        return host
    server = scope.get("server")
    if server and server[1] is not None:
        return f"{server[0]}:{server[1]}".encode("latin-1")
    return None


def rewrite_locations(
    headers: RawHeaders, upstream: Upstream, scope: Scope, host: bytes | None
) -> RawHeaders:
    """``headers`` with Location/Content-Location moved from the upstream to the gateway
    (``host``: the request's ``Host``, from its head)."""
    host = client_host(scope, host)
    if host is None:
        return headers
    root = scope.get("root_path", "").encode("utf-8")
    public = scope.get("scheme", "http").encode("ascii") + b"://" + host + root
    prefixes = _upstream_prefixes(upstream)
    return [
        (name, _rewrite(value, prefixes, public, upstream.base_path, root))
        if name in _REWRITTEN
        else (name, value)
        for name, value in headers
    ]


def _upstream_prefixes(upstream: Upstream) -> tuple[bytes, ...]:
    origin = upstream.origin.encode("ascii")
    explicit = f"{upstream.scheme}://{upstream.netloc.decode()}".encode("ascii")
    with_port = f"{upstream.scheme}://{_host(upstream)}:{upstream.port}".encode("ascii")
    return tuple(dict.fromkeys(p + upstream.base_path for p in (origin, explicit, with_port)))


def _host(upstream: Upstream) -> str:
    return f"[{upstream.host}]" if ":" in upstream.host else upstream.host


def _rewrite(value: bytes, prefixes: tuple[bytes, ...], public: bytes, base: bytes,
             root: bytes) -> bytes:  # fmt: skip
    for prefix in prefixes:
        if value.lower().startswith(prefix.lower()) and _boundary(value, len(prefix)):
            return public + value[len(prefix) :]
    if base and value.startswith(base) and _boundary(value, len(base)):
        return root + value[len(base) :]
    return value


def _boundary(value: bytes, at: int) -> bool:
    """The prefix ends at a path boundary (not ``/base`` matching ``/basement``)."""
    return len(value) == at or value[at : at + 1] in (b"/", b"?", b"#")


__all__ = ["client_host", "rewrite_locations"]
