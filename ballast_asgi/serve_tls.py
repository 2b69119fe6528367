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
* upgrades with ``loop.start_tls(..., server_side=True,
  ssl_handshake_timeout=header_timeout)`` (public asyncio API, also in
  uvloop), so a handshake never takes longer than ``server.header_timeout_ms``;
* hands the TLS transport to the HTTP protocol (the guarded one, see
  ``serve.py``) with the accept time, so the head timer runs from accept:
  handshake and first request head together get ``header_timeout_ms``
  (bytes the TLS layer delivered before that are replayed, ``_Handoff``).

The context is uvicorn's own (``uvicorn.config.create_ssl_context`` with
uvicorn's defaults: same versions, ciphers and ALPN as before).
"""

from __future__ import annotations

import asyncio
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


class TlsFront(asyncio.Protocol):
    """One accepted connection until its TLS handshake completes; then the HTTP protocol's."""

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
        self._task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        transport.pause_reading()  # the TLS layer reads first (start_tls resumes)
        self.transport = transport
        table = handshakes_in_progress(self.server_state)
        self._make_room(table)
        table[self] = None
        self._task = self.loop.create_task(self._handshake(transport))

    def _make_room(self, table: dict[TlsFront, None]) -> None:
        """Close the oldest handshakes until this one fits under the connection cap."""
        if self.limit is None:
            return
        while table and len(table) + len(self.server_state.connections) >= self.limit:
            next(iter(table)).abort()

    def abort(self) -> None:
        """Give up this handshake now (closed for room, or the connection went away)."""
        handshakes_in_progress(self.server_state).pop(self, None)
        if self._task is not None and not self._task.done():
            self._task.cancel()  # first: the handshake's waiter is cancelled, not answered
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        # Only before start_tls took the transport over (the TLS layer gets it after).
        self.abort()

    async def _handshake(self, raw: asyncio.Transport) -> None:
        handoff = _Handoff()
        try:
            tls = await self.loop.start_tls(
                raw, handoff, self.context, server_side=True,
                ssl_handshake_timeout=self.handshake_timeout_s,
            )  # fmt: skip
        except (Exception, asyncio.CancelledError):  # failed, timed out, or closed for room
            tls = None
        finally:
            handshakes_in_progress(self.server_state).pop(self, None)
        if tls is None or handoff.lost:  # e.g. the peer closed during the handshake
            if not raw.is_closing():
                raw.abort()
            return
        app = self.inner(**self._kwargs)
        with contextlib.suppress(AttributeError):
            app.accepted_at = self.accepted_at  # type: ignore[attr-defined]
        tls.set_protocol(app)
        app.connection_made(tls)
        handoff.replay(app, tls)


class _Handoff(asyncio.Protocol):
    """The TLS layer's protocol between the handshake and the HTTP protocol's ``connection_made``.

    The TLS layer may deliver the first request's bytes as soon as the
    handshake completes, before the task awaiting ``start_tls`` runs; they
    are kept here and replayed, in order, once the HTTP protocol has the
    transport.
    """

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.eof = False
        self.lost = False
        self.paused = False

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)

    def eof_received(self) -> bool:
        self.eof = True
        return True  # keep the transport; the HTTP protocol decides on replay

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False

    def replay(self, app: asyncio.Protocol, tls: asyncio.Transport) -> None:
        """What came meanwhile, to ``app`` (just given the transport)."""
        if self.paused:
            app.pause_writing()
        for chunk in self.chunks:
            if tls.is_closing():
                return
            app.data_received(chunk)
        if self.eof and not tls.is_closing() and not app.eof_received():
            tls.close()


def tls_front(
    inner: Callable[..., asyncio.Protocol], context: ssl.SSLContext, handshake_timeout_s: float
) -> type[TlsFront]:
    """A ``TlsFront`` class for uvicorn's ``http`` setting: ``inner`` serves after the handshake."""
    attrs = {"inner": inner, "context": context, "handshake_timeout_s": handshake_timeout_s}
    return type("TlsFront", (TlsFront,), attrs)
