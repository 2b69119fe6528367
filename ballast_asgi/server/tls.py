"""TLS handshakes under the server's guards: bounded by the head timeout, counted from accept.

uvicorn passes its ``SSLContext`` to ``loop.create_server`` and has no option
for the handshake, so asyncio's and uvloop's default applies: 60 s to
complete it. The HTTP protocol only sees the connection once the handshake
is done (``connection_made``), so before that neither
``server.header_timeout_ms`` (its timer starts there) nor
``server.max_connections`` (uvicorn counts ``server_state.connections``
from there) applied: idle sockets and partial ClientHellos stayed 60 s, and
420 of them exhausted the file descriptors real clients needed (issue 27).

So the gateway does the handshake itself. uvicorn serves plain TCP and makes
a ``TlsFront`` per accepted connection (its ``http`` protocol class, built
by ``tls_front``); the front

* counts the connection at once in the server's table of handshakes in
  progress. When handshakes in progress plus established connections reach
  ``limit_concurrency`` (``server.max_connections``), the *oldest* handshake
  still in progress is closed to make room (as nginx reuses idle connections
  when ``worker_connections`` run out): a flood of idle or partial
  ClientHellos holds at most that many sockets, and a client whose handshake
  completes in the meantime is served. Established connections are never
  closed for room; above the cap they get uvicorn's 503 per request as before;
* installs the TLS layer in ``connection_made``, before the first read,
  exactly as ``loop.create_server(ssl=...)`` does (the loop's own
  ``SSLProtocol``: uvloop's on uvloop, ``asyncio.sslproto``'s otherwise; the
  public ``loop.start_tls`` runs in a task, and uvloop starts reading before
  that task does, so a ClientHello could reach nobody), with
  ``ssl_handshake_timeout = header_timeout``: a handshake never takes longer
  than ``server.header_timeout_ms``;
* gives the HTTP protocol (the guarded one, see ``guarded.py``) the accept
  time, so the head timer runs from accept: handshake and first request
  head together get ``header_timeout_ms``. The TLS layer calls its
  ``connection_made`` when the handshake completes, before any request byte.

The context is uvicorn's own (``uvicorn.config.create_ssl_context`` with
uvicorn's defaults: same versions, ciphers and ALPN as before).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import contextlib
import ssl
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, cast

from uvicorn.config import SSL_PROTOCOL_VERSION, create_ssl_context

__all__ = ["TlsFront", "handshakes_in_progress", "server_ssl_context", "tls_front"]

#: The handshakes in progress of each uvicorn server, oldest first (keyed by its ServerState).
_TABLES: weakref.WeakKeyDictionary[Any, dict[TlsFront, None]] = weakref.WeakKeyDictionary()


def handshakes_in_progress(server_state: Any) -> dict[TlsFront, None]:
    """The server's table of connections accepted whose handshake has not completed."""
    table = _TABLES.get(server_state)
    if table is None:
        table = _TABLES[server_state] = {}
    return table


def server_ssl_context(
    certfile: str, keyfile: str | None, protocol_class: type[asyncio.Protocol] | None = None
) -> ssl.SSLContext:
    """The context uvicorn would build for ``--ssl-certfile/--ssl-keyfile`` (its defaults)."""
    alpn = getattr(protocol_class, "alpn_protocols", None)
    return create_ssl_context(certfile=certfile, keyfile=keyfile, password=None,
                              ssl_version=SSL_PROTOCOL_VERSION, cert_reqs=ssl.CERT_NONE,
                              ca_certs=None, ciphers=None, alpn_protocols=alpn)  # fmt: skip


def _ssl_protocol_class(loop: asyncio.AbstractEventLoop) -> Any:
    """The TLS protocol ``loop.create_server(ssl=...)`` itself uses on this loop."""
    try:
        import uvloop
        import uvloop.loop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings it
        return asyncio.sslproto.SSLProtocol
    if isinstance(loop, uvloop.Loop):
        return uvloop.loop.SSLProtocol  # type: ignore[attr-defined]
    return asyncio.sslproto.SSLProtocol


class TlsFront(asyncio.Protocol):
    """One accepted connection: installs the TLS layer at once, counted until its handshake ends."""

    #: The HTTP protocol class (uvicorn's keyword arguments) that serves after the handshake.
    inner: ClassVar[Callable[..., asyncio.Protocol]]
    context: ClassVar[ssl.SSLContext]
    handshake_timeout_s: ClassVar[float]

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._kwargs = {"config": config, "server_state": server_state, "app_state": app_state,
                        "_loop": _loop}  # fmt: skip
        self.loop = _loop or asyncio.get_event_loop()
        self.server_state = server_state
        self.limit: int | None = config.limit_concurrency
        self.accepted_at = self.loop.time()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Swap in the TLS layer before the first read (as ``create_server(ssl=)`` does)."""
        raw = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.transport = raw
        table = handshakes_in_progress(self.server_state)
        self._make_room(table)
        table[self] = None
        app = self.inner(**self._kwargs)
        with contextlib.suppress(AttributeError):
            app.accepted_at = self.accepted_at  # type: ignore[attr-defined]
        waiter = self.loop.create_future()
        waiter.add_done_callback(self._handshake_done)
        tls = _ssl_protocol_class(self.loop)(
            self.loop, app, self.context, waiter, server_side=True,
            ssl_handshake_timeout=self.handshake_timeout_s,
        )  # fmt: skip
        raw.set_protocol(tls)
        tls.connection_made(raw)  # starts the handshake and its timeout

    def _make_room(self, table: dict[TlsFront, None]) -> None:
        """Close the oldest handshakes until this one fits under the connection cap."""
        if self.limit is None:
            return
        while table and len(table) + len(self.server_state.connections) >= self.limit:
            next(iter(table)).abort()

    def abort(self) -> None:
        """Give up this handshake now (closed to make room)."""
        handshakes_in_progress(self.server_state).pop(self, None)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def _handshake_done(self, waiter: asyncio.Future[None]) -> None:
        """Completed, failed, timed out or aborted: no longer a handshake in progress."""
        handshakes_in_progress(self.server_state).pop(self, None)
        if not waiter.cancelled():
            waiter.exception()  # retrieved: a failed handshake is the client's business


def tls_front(
    inner: Callable[..., asyncio.Protocol], context: ssl.SSLContext, handshake_timeout_s: float
) -> type[TlsFront]:
    """A ``TlsFront`` class for uvicorn's ``http`` setting: ``inner`` serves after the handshake."""
    attrs = {"inner": inner, "context": context, "handshake_timeout_s": handshake_timeout_s}
    return type("TlsFront", (TlsFront,), attrs)
