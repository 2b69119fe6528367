"""uvicorn serving the gateway: its settings, its adoption, and the gateway's protocol.

The server-side guards uvicorn lacks (a request-head timeout, a head size cap,
lingering close after a refusal, closing after an unswitched upgrade) are the
``GuardedHttpToolsProtocol`` of ``guarded.py``; its request cycle
(``cycle.py``) joins each response's writes. The protocol is re-exported
here, where it always was (``--http ballast_asgi.server.serve:GuardedHttpToolsProtocol``
keeps working). This module puts them in front of the gateway:

* ``uvicorn_settings``: the ``uvicorn.Config`` keyword arguments the ``ballast``
  CLI passes (guarded protocol, websocket settings, keep-alive, connection cap,
  uvicorn's own proxy headers and ``date``/``server`` headers off);
* ``adopt_uvicorn``/``adopt_loading``: the same applied to a uvicorn config
  loading ``ballast_asgi.gateway:app`` (found among the live objects, no frame
  walking; registered in ``core.adopt``), explicit flags kept;
* ``GatewayProtocol``: ``--http ballast_asgi.server.serve:GatewayProtocol``
  adopts the config uvicorn hands to every protocol it builds.

With TLS (``server.ssl_certfile``) the handshake is done by
``ballast_asgi.server.tls``: bounded by ``header_timeout_ms``, counted against
``max_connections`` from accept, and the head timer runs from accept.

The ``ballast`` CLI always uses the guarded protocol; ``uvicorn
ballast_asgi.gateway:app`` gets it too (``ballast_asgi.gateway`` adopts
uvicorn's config when it is imported by uvicorn), and a hand-written server
can pass ``--http ballast_asgi.server.serve:GuardedHttpToolsProtocol``
(defaults).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
from collections.abc import Generator
from types import FrameType
from typing import Any, Protocol

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ballast_asgi.config.models import ServerConfig, WebSocketConfig
from ballast_asgi.gateway.root import freeze_after_startup
from ballast_asgi.server.guarded import _TIMER_SLACK_S as _TIMER_SLACK_S  # wire.py's
from ballast_asgi.server.guarded import (
    LINGER_IDLE_S,
    LINGER_MAX_S,
    GuardedHttpToolsProtocol,
    guarded_protocol,
)
from ballast_asgi.server.tls import server_ssl_context, tls_front

__all__ = [
    "LINGER_IDLE_S",
    "LINGER_MAX_S",
    "GatewayProtocol",
    "GuardedHttpToolsProtocol",
    "QuietServer",
    "adopt_loading",
    "adopt_uvicorn",
    "freeze_after_startup",
    "guarded_protocol",
    "uvicorn_settings",
    "websocket_settings",
]


class QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its caller."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


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
