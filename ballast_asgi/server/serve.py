"""Server-side guards uvicorn lacks: a request-head timeout and a request-head size cap.

uvicorn (httptools) closes idle keep-alive connections after
``--timeout-keep-alive`` but has no limit on how long a request head may take
to arrive (a connection that sends nothing, or one header byte a second, is
kept forever) and none on how large the head may grow (httptools buffers a
64 MB header value; h11 stops at ``h11_max_incomplete_event_size``, 16 KiB by
default). ``guarded_protocol(server_config)`` returns an ``HttpToolsProtocol``
subclass that adds both:

* ``header_timeout_ms``: from the connection's start, or the first byte of a
  request, to the end of its head. Exceeded: ``408`` (when some bytes came)
  and the connection is closed. Between requests uvicorn's keep-alive timeout
  applies.
* ``max_header_bytes``: bytes received while a head is incomplete (request
  line and headers, counted per read). Exceeded: ``431`` and close, before the
  app sees the request. The stack's own 431 (header count and bytes, see
  docs/security.md) still applies to what gets through.

Both refusals close as nginx does (lingering close): the answer is written,
the sending side shut (FIN), and whatever the client still sends is read and
discarded until it closes, goes quiet for ``LINGER_IDLE_S`` or
``LINGER_MAX_S`` passed. A plain ``close()`` with unread bytes in the socket
makes the kernel send a reset, which can destroy the answer before the
client reads it (issue 27 item 7: a head over the limit by more than the
socket buffer got a reset instead of its 431). The same close is used for
uvicorn's own 400 (a malformed head) and when the app's answer closes the
connection while the request body is still arriving (the stack's 413 for a
declared body, its 4xx refusals).

A request that asks to switch protocols and is not switched (``Connection:
upgrade`` with an ``Upgrade`` other than a websocket uvicorn takes, and
``CONNECT``): httptools parses nothing after its head, so the connection is
closed after the answer (``connection: close``) instead of holding a
keep-alive connection on which no later request would ever be read (issue
27 item 2; the stack refuses such a request when it declares a body, and
``CONNECT`` always, with 405). A ``CONNECT`` in authority form
(``CONNECT host:443``), which uvicorn cannot turn into a scope, gets the
same 405 here.

It also joins a response's writes (issue 18, hot path): uvicorn writes the
status line and headers when the app sends ``http.response.start`` and the
body when it sends ``http.response.body``, two socket writes for every small
response (a shed, a proxied 1 KB body). The request cycle gets a
``JoinedWrites`` in front of the connection's transport that keeps what was
written until the response completes, the loop turns (``call_soon``), 64 KiB
are pending, or anything else touches the transport, and then writes it at
once, in order.

With TLS (``server.ssl_certfile``) the handshake is done by
``ballast_asgi.server.tls``: bounded by ``header_timeout_ms``, counted against
``max_connections`` from accept, and the head timer runs from accept.

The ``ballast`` CLI always uses it; ``uvicorn ballast_asgi.gateway:app`` gets
it too (``ballast_asgi.gateway`` adopts uvicorn's config when it is imported
by uvicorn), and a hand-written server can pass
``--http ballast_asgi.server.serve:GuardedHttpToolsProtocol`` (defaults).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
from collections.abc import Callable, Generator
from types import FrameType
from typing import Any, Protocol

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from ballast_asgi.config.models import ServerConfig, WebSocketConfig
from ballast_asgi.gateway.root import freeze_after_startup
from ballast_asgi.server.tls import server_ssl_context, tls_front

__all__ = [
    "GatewayProtocol",
    "GuardedHttpToolsProtocol",
    "JoinedWrites",
    "QuietServer",
    "adopt_loading",
    "adopt_uvicorn",
    "freeze_after_startup",
    "guarded_protocol",
    "uvicorn_settings",
]


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its caller."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


#: A head timer that fires this close to its due time times the head out (loop timers
#: may fire up to their clock's resolution early).
_TIMER_SLACK_S = 0.001

#: Lingering close after a refusal: stop when the client is quiet this long, or after the max.
LINGER_IDLE_S = 2.0
LINGER_MAX_S = 10.0

#: uvicorn's own defaults, which ``adopt_uvicorn`` may replace (explicit flags are kept).
_UVICORN_KEEP_ALIVE_S = 5


class _Adoptable(Protocol):
    server_may_rewrite: bool

    @property
    def server_protocol(self) -> type[GuardedHttpToolsProtocol] | None: ...

    @property
    def server_config(self) -> ServerConfig: ...

    @property
    def websocket_config(self) -> WebSocketConfig: ...


#: Pending response bytes written at once without waiting for the loop to turn.
_JOIN_LIMIT = 64 * 1024


class JoinedWrites:
    """A connection transport for the request cycle: writes joined until flushed.

    ``flush`` runs when the response completes (the protocol calls it), on the
    next loop iteration (scheduled by the first pending write, so a streamed
    head or chunk is never held back), once ``_JOIN_LIMIT`` bytes are pending
    (uvicorn's write flow control then sees them), and before anything else is
    done with the transport (close, ``is_closing`` is read-only and passes through).
    """

    __slots__ = ("_loop", "_pending", "_scheduled", "_size", "on_close", "transport")

    def __init__(
        self,
        transport: asyncio.Transport,
        loop: asyncio.AbstractEventLoop,
        on_close: Callable[[], bool] | None = None,
    ) -> None:
        self.transport = transport
        #: Called by ``close``; True when it took over the closing (a lingering close).
        self.on_close = on_close
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    def write(self, data: bytes) -> None:
        """Keep ``data``; the first pending write schedules a flush on the next loop turn."""
        self._pending.append(data)
        self._size += len(data)
        if self._size >= _JOIN_LIMIT:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._scheduled = False
        if self._pending:
            self.flush()

    def flush(self) -> None:
        """Write everything pending in one ``transport.write`` (dropped once closing)."""
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        self._pending = []
        self._size = 0
        if not self.transport.is_closing():
            self.transport.write(data)

    def is_closing(self) -> bool:
        """Whether the connection is closing (nothing pending is lost by asking)."""
        return self.transport.is_closing()

    def close(self) -> None:
        """Flush, then close the connection (or let ``on_close`` close it lingering)."""
        self.flush()
        if self.on_close is None or not self.on_close():
            self.transport.close()

    def __getattr__(self, name: str) -> Any:
        self.flush()
        return getattr(self.transport, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """httptools protocol with a head timeout (408) and a head size cap (431)."""

    header_timeout_s: float = ServerConfig().header_timeout_ms / 1000.0
    max_header_bytes: int = ServerConfig().max_header_bytes

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._began = False
        #: Loop time the current head began (connection start or first byte); None between.
        self._head_since: float | None = None
        self._head_timer: asyncio.TimerHandle | None = None
        self._joined: JoinedWrites | None = None
        #: Loop time the connection was accepted, when that was before ``connection_made``
        #: (set by ``serve_tls.TlsFront``: the handshake counts against the head timeout).
        self.accepted_at: float | None = None
        #: Lingering after a refusal: (loop time of the last read, loop time to stop by).
        self._linger: tuple[float, float] | None = None
        #: The current request's body has been read to its end (or there is no request).
        self._body_done = True
        #: A protocol switch was asked and not made: httptools parses nothing more here.
        self._unswitched = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._joined = JoinedWrites(transport, self.loop, self._close_after_response)
        self._head_begins(self.accepted_at)

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_since = None
        self._linger = None
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._linger is not None:  # refused: read and discard until the client is done
            self._linger = (self.loop.time(), self._linger[1])
            return
        joined = self._joined
        if joined is not None and joined._pending:  # the protocol may write (400) itself
            joined.flush()
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_header_bytes and self._linger is None:
            self._refuse(431)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._message_begins()

    def _message_begins(self) -> None:
        """A request head began: time it (``ballast_asgi/server/wire.py`` calls this too)."""
        self._in_head = self._began = True
        if self._head_since is None:
            self._head_begins()

    def on_headers_complete(self) -> None:
        if self.parser.get_method() == b"CONNECT" and not self.url.startswith(b"/"):
            self._in_head = False  # authority form: uvicorn would answer 400; refused as nginx
            self._refuse(405)
            return
        self._body_done = False
        self._in_head = self._began = False
        self._head_bytes = 0
        self._head_since = None  # the timer, if armed, finds nothing to do and lapses
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not before and cycle is not None:
            if self.parser.should_upgrade():  # not switched: nothing after this head is read
                cycle.keep_alive = False
                self._unswitched = True
            if self._joined is not None:
                cycle.transport = self._joined  # type: ignore[assignment]

    def on_response_complete(self) -> None:
        if self._joined is not None:
            self._joined.flush()
        super().on_response_complete()

    def on_message_complete(self) -> None:
        self._body_done = True
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = 0

    def _head_begins(self, since: float | None = None) -> None:
        """Start timing a head; arm the connection's one timer only when none is pending.

        The timer is lazy: a head that completes in time does not cancel it
        (``_head_since`` goes back to None); when it fires it re-arms for the
        head in progress, if any, or lapses. So a keep-alive connection costs
        one timer per ``header_timeout_s``, not a ``call_later`` + ``cancel``
        per request (issue 18).
        """
        self._head_since = self.loop.time() if since is None else since
        if self._head_timer is None:
            self._arm(self._head_since + self.header_timeout_s)

    def _arm(self, when: float) -> None:
        self._head_timer = self.loop.call_at(when, self._head_check)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_check(self) -> None:
        """The timer fired: time out the head in progress, re-arm for a later one, or lapse."""
        self._head_timer = None
        since = self._head_since
        if since is None:
            return
        due = since + self.header_timeout_s
        if self.loop.time() < due - _TIMER_SLACK_S:  # a later head than the one armed for
            self._arm(due)
        else:
            self._head_timeout()

    def _head_timeout(self) -> None:
        self._head_since = None
        if self._head_bytes or self._began:
            self._refuse(408)
        elif not self.transport.is_closing():
            self.transport.close()

    def _refuse(self, status: int) -> None:
        """Answer ``status`` with an empty body and close (nothing reached the app)."""
        self._head_since = None
        self._disarm()
        if self.transport.is_closing() or self._linger is not None:
            return
        self.logger.warning("request head refused with %d (%d bytes)", status, self._head_bytes)
        self.transport.write(
            STATUS_LINE[status] + b"content-length: 0\r\nconnection: close\r\n\r\n"
        )
        self._linger_close()

    def _close_after_response(self) -> bool:
        """The app's answer closes the connection: linger if the request body is still coming.

        (A 413 for a declared body, a 4xx from admission: closing at once with the
        body still arriving would reset the connection under the answer.)
        """
        if (self._body_done and not self._unswitched) or self._linger is not None:
            return False
        self._linger_close()
        return True

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 for a malformed request, closed lingering (the same bytes)."""
        content = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: text/plain; charset=utf-8\r\n",
                b"content-length: " + str(len(msg)).encode("ascii") + b"\r\n",
                b"connection: close\r\n",
                b"\r\n",
                msg.encode("ascii"),
            ]
        )
        self._head_since = None
        self.transport.write(b"".join(content))
        self._linger_close()

    def _linger_close(self) -> None:
        """Shut the sending side after the answer; read and discard until the client is done."""
        self._disarm()
        transport = self.transport
        now = self.loop.time()
        self._linger = (now, now + LINGER_MAX_S)
        try:
            if transport.can_write_eof():
                transport.write_eof()  # FIN once the answer is out; reading goes on
            transport.resume_reading()
        except (NotImplementedError, RuntimeError, OSError):  # e.g. TLS: no half-close
            pass
        self._head_timer = self.loop.call_at(now + LINGER_IDLE_S, self._linger_check)

    def _linger_check(self) -> None:
        """Close once the client was quiet for ``LINGER_IDLE_S`` or ``LINGER_MAX_S`` passed."""
        self._head_timer = None
        linger = self._linger
        if linger is None:
            return
        last, until = linger
        due = min(last + LINGER_IDLE_S, until)
        if self.loop.time() < due - _TIMER_SLACK_S:
            self._head_timer = self.loop.call_at(due, self._linger_check)
        else:
            self._linger = None
            self.transport.close()


def guarded_protocol(
    server: ServerConfig, base: type[GuardedHttpToolsProtocol] | None = None
) -> type[GuardedHttpToolsProtocol]:
    """A ``GuardedHttpToolsProtocol`` (or the subclass ``base``) with the limits of ``server``.

    The gateway's ``server_protocol`` is such a ``base``: the ``WireShedProtocol``
    of ``ballast_asgi/server/wire.py`` while ``server.shed_at_wire`` is on.
    """
    attrs = {
        "header_timeout_s": server.header_timeout_ms / 1000.0,
        "max_header_bytes": server.max_header_bytes,
    }
    base = base or GuardedHttpToolsProtocol
    return type(base.__name__, (base,), attrs)


def websocket_settings(websocket: WebSocketConfig) -> dict[str, Any]:
    """uvicorn's websocket settings from the ``websocket`` section: the paced protocol
    (``serve_ws.py``), the largest message a client may send (``--ws-max-size``, else
    16 MiB) and the messages the legacy ``websockets`` protocol queues (else 32)."""
    from ballast_asgi.server.ws import paced_protocol

    return {
        "ws": paced_protocol(websocket),
        "ws_max_size": websocket.max_message_bytes,
        "ws_max_queue": _WS_MAX_QUEUE,
    }


#: Messages uvicorn's legacy websockets protocol may queue ahead of the relay.
_WS_MAX_QUEUE = 2
_UVICORN_WS_MAX_SIZE = 16 * 1024 * 1024
_UVICORN_WS_MAX_QUEUE = 32


def uvicorn_settings(
    server: ServerConfig,
    websocket: WebSocketConfig | None = None,
    base: type[GuardedHttpToolsProtocol] | None = None,
) -> dict[str, Any]:
    """``uvicorn.Config`` keyword arguments for the gateway (the CLI passes these;
    ``base``: the gateway's ``server_protocol``, see ``guarded_protocol``).

    With ``server.ssl_certfile`` uvicorn serves plain TCP and the ``http`` class
    is a ``serve_tls.TlsFront`` doing the handshake under the server's guards.
    """
    http: type[asyncio.Protocol] = guarded_protocol(server, base)
    if server.ssl_certfile:
        context = server_ssl_context(server.ssl_certfile, server.ssl_keyfile, http)
        http = tls_front(http, context, server.header_timeout_ms / 1000.0)
    return {
        **websocket_settings(websocket or WebSocketConfig()),
        "http": http,
        "proxy_headers": False,
        "server_header": False,
        "date_header": False,
        "timeout_keep_alive": server.keep_alive_ms / 1000.0,
        "limit_concurrency": server.max_connections,
        "timeout_graceful_shutdown": server.shutdown_timeout_ms / 1000.0,
    }


def adopt_uvicorn(gateway: _Adoptable, config: Any) -> bool:
    """Apply the gateway's server settings to ``config``, a uvicorn ``Config`` loading it.

    ``uvicorn ballast_asgi.gateway:app`` loads the app through ``Config.load``,
    which wraps it in uvicorn's proxy-headers middleware afterwards and sends
    its own ``date``/``server`` next to the upstream's. That config gets:
    proxy headers off (the gateway decides, see ``proxy.trusted_proxies``), no
    date/server headers of its own, the guarded httptools protocol (the
    gateway's ``server_protocol``: shed at the wire), uvicorn's
    per-request access log off unless ``--access-log`` (or
    ``UVICORN_ACCESS_LOG``) asked for it (one log record per request was about
    7 % of the gateway's CPU at saturation; the gateway's own is
    ``access_log.enabled``), with ``--ssl-certfile`` the TLS handshake done by
    ``serve_tls`` (bounded and counted), and the keep-alive and connection cap
    of the ``server`` section where uvicorn's flags were left at their
    defaults, and so are the websocket protocol (paced), message size and
    queue (``websocket_settings``). Returns whether ``config`` was a uvicorn
    config still loading (adopted once: a second call changes nothing more).

    ``config`` may also be the frame of ``Config.load`` (the old signature):
    its ``self`` is taken, no other frame is looked at.
    """
    from uvicorn.config import Config

    if isinstance(config, FrameType):
        config = config.f_locals.get("self")
    if not isinstance(config, Config) or config.loaded:
        return False
    server = gateway.server_config
    gateway.server_may_rewrite = False
    _headers_off(config)
    if config.access_log and not _access_log_requested():
        _access_log_off(config)
    if getattr(config, "http_protocol_class", None) is HttpToolsProtocol:
        config.http_protocol_class = guarded_protocol(server, gateway.server_protocol)
    context = getattr(config, "ssl", None)
    if context is not None:  # --ssl-certfile: the handshake under guards
        timeout_s = server.header_timeout_ms / 1000.0
        config.http_protocol_class = tls_front(config.http_protocol_class, context, timeout_s)
        config.ssl = None
    _server_caps(config, server, gateway.websocket_config)
    return True


def _headers_off(config: Any) -> None:
    """No proxy-headers rewrite, no ``date``/``server`` header of uvicorn's own."""
    if config.proxy_headers:
        config.proxy_headers = False
        print(
            "ballast: uvicorn's proxy-headers rewrite is off for this app; forwarded headers "
            "are believed only from proxy.trusted_proxies",
            file=sys.stderr,
        )
    config.date_header = False
    config.encoded_headers = [h for h in config.encoded_headers if h[0] != b"server"]


def _server_caps(config: Any, server: ServerConfig, websocket: WebSocketConfig) -> None:
    """Keep-alive, connection cap, shutdown and websocket settings where uvicorn's
    flags were left at their defaults (an explicit flag stays)."""
    if config.timeout_keep_alive == _UVICORN_KEEP_ALIVE_S:
        config.timeout_keep_alive = server.keep_alive_ms / 1000.0
    if config.limit_concurrency is None:
        config.limit_concurrency = server.max_connections
    if config.timeout_graceful_shutdown is None:
        config.timeout_graceful_shutdown = server.shutdown_timeout_ms / 1000.0
    ws = websocket_settings(websocket)
    if getattr(config, "ws_protocol_class", None) is _uvicorn_default_ws():
        config.ws_protocol_class = ws["ws"]
    if config.ws_max_size == _UVICORN_WS_MAX_SIZE:
        config.ws_max_size = ws["ws_max_size"]
    if config.ws_max_queue == _UVICORN_WS_MAX_QUEUE:
        config.ws_max_queue = ws["ws_max_queue"]


def loading_configs(name: str) -> list[Any]:
    """The uvicorn ``Config`` objects loading the app ``name`` (``module:attribute``) now.

    Found among the live objects (``gc.get_objects``: public API, no stack
    frames): a ``uvicorn.Config`` whose ``app`` is that string and which is
    not ``loaded`` yet. Run once or twice per start (each access of the app).
    """
    if "uvicorn.config" not in sys.modules:  # no uvicorn here: nothing is loading us
        return []
    from uvicorn.config import Config

    return [o for o in gc.get_objects() if type(o) is Config and not o.loaded and o.app == name]


def adopt_loading(app: Any, name: str) -> bool:
    """Adopt every uvicorn config loading ``app`` by ``name`` (``core.adopt``'s adopter)."""
    adopted = False
    for config in loading_configs(name):
        adopted = adopt_uvicorn(app, config) or adopted
    return adopted


def _gateway_of(app: Any) -> Any:
    """The gateway inside uvicorn's wrappers (proxy headers, message logger), or None."""
    for _ in range(4):
        if hasattr(app, "server_config") and hasattr(app, "websocket_config"):
            return app
        app = getattr(app, "app", None)
    return None


class GatewayProtocol(GuardedHttpToolsProtocol):
    """The guarded protocol that adopts the uvicorn config it is constructed with.

    ``uvicorn ballast_asgi.gateway:app --http ballast_asgi.server.serve:GatewayProtocol``:
    uvicorn passes its ``config`` to every protocol it builds (documented:
    ``--http`` takes a protocol class path). The first one applies the
    gateway's server settings to that config (``adopt_uvicorn`` minus what
    only start-up can change: uvicorn's proxy-headers wrapper is taken off the
    loaded app, its ``date``/``server`` headers are dropped from the server's
    default headers); every one takes the head timeout and size cap of the
    gateway's ``server`` section. With ``--ssl-certfile`` the handshake is
    uvicorn's (use ``ballast --ssl-certfile``, or the plain form, for the
    guarded one).
    """

    def __init__(self, config: Any, server_state: Any, *args: Any, **kwargs: Any) -> None:
        gateway = _gateway_of(config.loaded_app)
        if gateway is not None:
            server = gateway.server_config
            self.header_timeout_s = server.header_timeout_ms / 1000.0
            self.max_header_bytes = server.max_header_bytes
            if not getattr(config, "_ballast_adopted", False):
                _adopt_loaded(config, server_state, gateway)
        super().__init__(config, server_state, *args, **kwargs)


def _adopt_loaded(config: Any, server_state: Any, gateway: Any) -> None:
    """``adopt_uvicorn`` for a config already loaded (from the first protocol built)."""
    config._ballast_adopted = True
    gateway.server_may_rewrite = False
    if config.proxy_headers and _gateway_of(config.loaded_app) is not config.loaded_app:
        config.loaded_app = config.loaded_app.app  # uvicorn's proxy-headers wrapper
    _headers_off(config)
    server_state.default_headers = [
        h for h in server_state.default_headers if h[0] not in (b"date", b"server")
    ]
    if config.access_log and not _access_log_requested():
        _access_log_off(config)
    _server_caps(config, gateway.server_config, gateway.websocket_config)


def _uvicorn_default_ws() -> Any:
    """The websocket protocol class uvicorn's ``--ws auto`` picks (None without a library)."""
    from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

    return AutoWebSocketsProtocol


def _access_log_requested() -> bool:
    """Whether uvicorn's access log was asked for explicitly (its default is on)."""
    env = os.environ.get("UVICORN_ACCESS_LOG", "").strip().lower()
    return "--access-log" in sys.argv or env in ("1", "true", "yes", "on")


def _access_log_off(config: Any) -> None:
    """What ``--no-access-log`` does: the access logger without handlers (checked per
    connection by uvicorn's protocol, so nothing is formatted or written per request)."""
    config.access_log = False
    access = logging.getLogger("uvicorn.access")
    access.handlers = []
    access.propagate = False
    print(
        "ballast: uvicorn's access log is off for this app (pass --access-log to keep it; "
        "access_log.enabled writes the gateway's own JSON line)",
        file=sys.stderr,
    )
