"""Config sections of the process around the stages: admin, server, websockets, access log."""

from __future__ import annotations

import ssl

from pydantic import Field, model_validator

from ballast_asgi.config.base import Frozen, readable
from ballast_asgi.core import websocket as ws


class AdminConfig(Frozen):
    """Admin endpoints (see docs/security.md)."""

    #: Enables POST /_ballast/reload; required as a bearer token.
    token: str | None = None
    #: Serve /_ballast/* on the traffic port too (false: only on the admin port).
    on_traffic_port: bool = True
    #: Require the bearer token on every admin endpoint except health.
    token_required: bool = False

    @model_validator(mode="after")
    def _token(self) -> AdminConfig:
        if self.token_required and not self.token:
            raise ValueError("admin.token_required needs admin.token")
        return self


class ServerConfig(Frozen):
    """The HTTP server under the ``ballast`` CLI (uvicorn; see docs/security.md)."""

    #: Close a connection idle this long between requests.
    keep_alive_ms: int = Field(5_000, ge=100, le=600_000)
    #: Close a connection whose request head is not complete this long after it began.
    header_timeout_ms: int = Field(10_000, ge=100, le=600_000)
    #: Request-head bytes (request line and headers) allowed before 431.
    max_header_bytes: int = Field(65_536, ge=1_024, le=16 * 1024 * 1024)
    #: Answer a request the stages would shed from its parsed head, before any ASGI work
    #: (the gateway form; ``ballast_asgi/server/wire.py``). False: every request goes
    #: through uvicorn's ASGI cycle and the stages, as before.
    shed_at_wire: bool = True
    #: Serve the common proxied request (no body, one upstream, an idle pooled upstream
    #: connection) from the server protocol with callbacks, without an ASGI task
    #: (``ballast_asgi/gateway/lane.py``, ADR 0020). False: the ASGI path, as before.
    lane: bool = True
    #: Open connections (and running requests) above which uvicorn answers 503.
    max_connections: int = Field(10_000, ge=1, le=1_000_000)
    #: PEM certificate chain and key: serve TLS (https) on the traffic and admin ports.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: On SIGTERM: health answers 503 ``draining`` and traffic is still served this long.
    drain_grace_ms: int = Field(5_000, ge=0, le=600_000)
    #: Then the listener closes; in-flight and queued requests get this long to finish.
    shutdown_timeout_ms: int = Field(30_000, ge=0, le=3_600_000)

    @model_validator(mode="after")
    def _tls(self) -> ServerConfig:
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("server.ssl_keyfile needs server.ssl_certfile")
        for key in ("ssl_certfile", "ssl_keyfile"):
            readable(getattr(self, key), f"server.{key}")
        if self.ssl_certfile:
            check_tls_pair(self.ssl_certfile, self.ssl_keyfile)
        return self


def check_tls_pair(certfile: str, keyfile: str | None) -> None:
    """Load the certificate and key as the server will at start-up; a ValueError naming the
    key when they do not load (not PEM, no private key, key and certificate do not match)."""
    try:
        with open(certfile, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"server.ssl_certfile: cannot read {certfile!r}: {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in text:
        raise ValueError(f"server.ssl_certfile: {certfile!r} holds no PEM certificate")
    if keyfile is None and b"PRIVATE KEY-----" not in text:
        raise ValueError(
            f"server.ssl_certfile: {certfile!r} holds no private key; set server.ssl_keyfile "
            "(--ssl-keyfile) to the key's file"
        )
    decode = getattr(ssl._ssl, "_test_decode_cert", None)  # type: ignore[attr-defined]
    if decode is not None:
        try:
            decode(certfile)
        except (ssl.SSLError, ValueError):
            raise ValueError(
                f"server.ssl_certfile: {certfile!r} is not a valid PEM certificate"
            ) from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile, password=_no_password)
    except (ssl.SSLError, ValueError) as exc:
        key = "server.ssl_keyfile" if keyfile else "server.ssl_certfile"
        why = getattr(exc, "reason", None) or str(exc).split(" (_ssl")[0]
        raise ValueError(
            f"{key}: cannot load the key for {certfile!r} ({why}): it must be an unencrypted "
            "PEM private key matching the certificate"
        ) from None
    except OSError as exc:
        raise ValueError(f"server.ssl_keyfile: cannot read {keyfile!r}: {exc.strerror}") from None


def _no_password() -> bytes:
    raise ValueError("encrypted private keys are not supported (no passphrase setting)")


class WebSocketConfig(Frozen):
    """WebSocket upgrades, proxied to the upstream (ballast_asgi/proxy/websocket.py)."""

    #: Proxy websocket upgrades; false: refuse them (403) with one log line each.
    enabled: bool = True
    #: Open websocket connections, counted apart from the concurrency limiter.
    max_connections: int = Field(1_000, ge=1, le=1_000_000)
    #: Share of max_connections only the critical tier may use.
    reserved_fraction: float = Field(0.1, ge=0.0, le=1.0)
    #: Open websockets one client address (as resolved behind proxy.trusted_proxies) may hold.
    max_connections_per_client: int = Field(
        ws.DEFAULT_MAX_CONNECTIONS_PER_CLIENT, ge=1, le=1_000_000
    )
    #: Largest message accepted from either side: the upstream client's limit, the relay's
    #: check, and uvicorn's --ws-max-size under the ``ballast`` CLI and ``uvicorn
    #: ballast_asgi.gateway:app``. Larger: the connection is closed with 1009.
    max_message_bytes: int = Field(ws.DEFAULT_MAX_MESSAGE_BYTES, ge=1_024, le=64 * 1024 * 1024)
    #: Time allowed for the upstream's opening handshake.
    open_timeout_ms: int = Field(5_000, ge=1, le=600_000)
    #: Bytes one connection may hold read from one side and not yet written to the other
    #: (a soft limit: reading stops at it; counted in capacity.max_buffered_bytes too).
    buffer_bytes: int = Field(ws.DEFAULT_BUFFER_BYTES, ge=1_024, le=1024 * 1024 * 1024)
    #: No message either way for this long: both sides are closed (1001).
    idle_timeout_ms: int = Field(ws.DEFAULT_IDLE_TIMEOUT_MS, ge=100, le=86_400_000)
    #: One write to either side (and each close) that does not finish this long ends it.
    send_timeout_ms: int = Field(ws.DEFAULT_SEND_TIMEOUT_MS, ge=1, le=3_600_000)
    #: The closing handshake with the upstream after either side closed; then its connection
    #: is dropped (nginx drops it at once), so a stalled upstream cannot hold the slot.
    close_timeout_ms: int = Field(ws.DEFAULT_CLOSE_TIMEOUT_MS, ge=1, le=600_000)
    #: Messages per second relayed from one side of one connection (faster: read later).
    max_messages_per_s: float = Field(ws.DEFAULT_MAX_MESSAGES_PER_S, ge=1.0, le=1_000_000.0)
    #: Bytes per second relayed from one side of one connection (faster: read later).
    max_bytes_per_s: int = Field(ws.DEFAULT_MAX_BYTES_PER_S, ge=1_024, le=2**34)


class WorkersConfig(Frozen):
    """``ballast --workers N`` (ballast_asgi/server/supervisor.py)."""

    #: When a worker is given up (a crash loop), divide the reloadable caps
    #: (concurrency, limiter, queue, held requests and bytes, websockets) over
    #: the workers still live instead of keeping each at 1/N. Off by default:
    #: the live workers then serve with their 1/N share.
    redivide_on_loss: bool = False


class AccessLogConfig(Frozen):
    """The optional JSON access log (ballast_asgi/ops/access_log.py)."""

    #: One JSON line per request on stdout (method, path, status, priority, shed
    #: reason, queue wait, upstream, duration).
    enabled: bool = False
