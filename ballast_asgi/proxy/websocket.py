"""WebSocket upgrades through the gateway: admitted at the upgrade, then frames both ways.

The HTTP stages pass ``websocket`` scopes through untouched; the gateway
sends them here. At the upgrade (``websocket.connect``) the same decisions as
for an HTTP request, in the same order:

1. turned off (``websocket.enabled: false``): refused with 403 and one log line;
2. ``X-Priority`` (through the same ``Classifier`` as HTTP: trusted peers only)
   and ``X-Deadline-Ms`` are parsed; a malformed one is a 400 naming it; a
   deadline already spent is a ``deadline`` shed (dead on arrival);
3. the rate limit (``rate_limit.*``, when enabled): the upgrade spends from the
   bucket an HTTP ``GET`` to the same path from the same client would, and is
   refused as that request would be (``rate_limited``, ``Retry-After`` the
   refill time, the ``RateLimit`` headers); an admitted upgrade's 101 carries
   the ``RateLimit`` headers too when ``rate_limit.headers`` is ``all``;
4. the connection takes a slot of its own cap (``websocket.max_connections``,
   a ``reserved_fraction`` kept for the critical tier, at most
   ``max_connections_per_client`` for one client address as the gateway
   resolves it behind ``proxy.trusted_proxies``), never a concurrency
   permit: a connection that lives for minutes is not an RTT sample. Full:
   a ``capacity`` shed;
5. the upstream handshake is made (same upstream selector as HTTP, URL built
   from the upstream's parts and the origin-form target; client headers
   forwarded minus hop-by-hop and ``Sec-WebSocket-*``, subprotocols offered
   as the client offered them; bounded by ``open_timeout_ms`` and the
   deadline). Failure: 502 (504 on timeout), the upstream's status when it
   refused the upgrade.

A shed (steps 2-4) is written by the shared ``ShedResponder``: the configured
shed status, ``Retry-After``, ``X-Ballast-Reason`` and the JSON body of an HTTP
shed, counted in ``ballast_shed_total``; in dry-run it is counted as a would-be
shed and the upgrade goes on (without a slot). Refusals use the ASGI
``websocket.http.response`` extension (uvicorn's three websocket
implementations have it) so the client sees that real response; a server
without it gets ``websocket.close`` before the accept (uvicorn: 403).

Step 5 is ``proxy/ws_upstream.py``. Then ``proxy/ws_relay.py`` relays frames
until either side closes or a limit ends the connection (idle, send timeouts,
message size, buffered bytes).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge
from websockets.protocol import State

from ballast_asgi.config.models import WebSocketConfig
from ballast_asgi.core.capacity import ByteBudget
from ballast_asgi.core.classify import Classifier
from ballast_asgi.core.connections import ConnectionCap
from ballast_asgi.core.deadline import DEADLINE_HEADER, absolute_deadline
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.forwarded import client_ip
from ballast_asgi.core.head import HeadLimits, read_head
from ballast_asgi.core.outcome import (
    ShedReason,
)
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import Clock, Message, Receive, Scope, Send
from ballast_asgi.core.websocket import RelayLimits
from ballast_asgi.middleware.ratelimit import rate_limit_headers, rate_limit_shed
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.proxy.headers import origin_form
from ballast_asgi.proxy.upstream import Selector
from ballast_asgi.proxy.ws_relay import Relay
from ballast_asgi.proxy.ws_upstream import Refused, open_upstream
from ballast_asgi.ratelimit.runtime import RateLimitRuntime
from ballast_asgi.telemetry.metrics import Metrics

__all__ = ["WebSocketProxy", "relay_limits"]

#: Bounds for an upgrade's head (uvicorn already bounded its size; the defaults add the
#: field count and the framing rules every HTTP request gets at admission).
_UPGRADE_HEAD = HeadLimits()
log = logging.getLogger("ballast.websocket")
_DENIAL = "websocket.http.response"


@dataclass(frozen=True, slots=True)
class _Admitted:
    """An upgrade past admission: its tier, deadline, whether it holds a cap slot, and the
    headers its accept carries."""

    priority: Priority
    deadline: float | None
    held: bool
    headers: list[tuple[bytes, bytes]]


class _Shed(Exception):
    """An upgrade shed like an HTTP request (written by the ``ShedResponder``)."""

    def __init__(self, shed: Shed, label: str) -> None:
        super().__init__(label)
        self.shed, self.label = shed, label


def relay_limits(config: WebSocketConfig) -> RelayLimits:
    """The relay's limits from the ``websocket`` config section."""
    return RelayLimits(
        max_message_bytes=config.max_message_bytes,
        buffer_bytes=config.buffer_bytes,
        idle_timeout_ms=config.idle_timeout_ms,
        send_timeout_ms=config.send_timeout_ms,
        close_timeout_ms=config.close_timeout_ms,
        max_messages_per_s=config.max_messages_per_s,
        max_bytes_per_s=config.max_bytes_per_s,
    )


class WebSocketProxy:
    """Admit a websocket upgrade, open the upstream one, relay frames and the close."""

    def __init__(
        self,
        *,
        config: WebSocketConfig,
        selector: Selector,
        classifier: Classifier,
        metrics: Metrics,
        responder: ShedResponder | None = None,
        ratelimit: RateLimitRuntime | None = None,
        budget: ByteBudget | None = None,
        default_priority: Priority = Priority.STANDARD,
        clock: Clock = time.monotonic,
    ) -> None:
        self.selector = selector
        self.classifier = classifier
        self.metrics = metrics
        self.responder = responder or ShedResponder(metrics)
        self.ratelimit = ratelimit
        #: Bytes held by every relay (also reserved in ``budget``, the gateway's shared one).
        self.buffered = ByteBudget(2**62)
        self.budgets = (self.buffered,) if budget is None else (budget, self.buffered)
        self.default_priority = default_priority
        self.clock = clock
        self.cap = ConnectionCap(1)
        self.reconfigure(config)
        self.open_gauge = Gauge(
            "ballast_websocket_connections", "Open proxied websocket connections.",
            registry=metrics.registry,
        )  # fmt: skip
        self.refused = Counter(
            "ballast_websocket_refused", "Websocket upgrades refused, by reason.", ["reason"],
            registry=metrics.registry,
        )  # fmt: skip
        self.closed = Counter(
            "ballast_websocket_closed", "Relayed websockets ended, by how.", ["reason"],
            registry=metrics.registry,
        )  # fmt: skip
        self.open_gauge.set_function(lambda: self.cap.open)

    def reconfigure(self, config: WebSocketConfig) -> None:
        """Apply a (reloaded) ``websocket`` section: new upgrades and relays use it."""
        self.config = config
        self.limits = relay_limits(config)
        cap = ConnectionCap(
            config.max_connections, config.reserved_fraction, config.max_connections_per_client
        )
        self.cap.max_connections, self.cap.shared = cap.max_connections, cap.shared
        self.cap.max_per_client = cap.max_per_client

    def snapshot(self) -> dict[str, Any]:
        """Open connections against the caps, and the bytes the relays hold."""
        return {**self.cap.snapshot(), "buffered_bytes": self.buffered.used_bytes,
                "peak_buffered_bytes": self.buffered.peak_bytes}  # fmt: skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        client = client_ip(scope)
        try:
            admitted = await self._admit(scope, client)
        except Refused as refusal:
            await self._refuse(scope, send, refusal)
            return
        except _Shed as shed:
            await self._shed(scope, send, shed)
            return
        try:
            await self._serve(scope, receive, send, admitted)
        except Refused as refusal:
            await self._refuse(scope, send, refusal)
        finally:
            if admitted.held:
                self.cap.release(client)

    async def _admit(self, scope: Scope, client: str | None) -> _Admitted:
        """An admitted upgrade; ``Refused`` (an error answer) or ``_Shed`` (a shed) otherwise."""
        if not self.config.enabled:
            log.warning("websocket upgrade refused (websocket.enabled is false): %s", scope["path"])
            raise Refused(403, {"error": "websockets_disabled"}, "disabled")
        if not origin_form(scope):
            payload: dict[str, object] = {"error": "bad_request", "message": "bad target"}
            raise Refused(400, payload, "bad_request")
        priority, deadline = self._classify(scope)
        if deadline is not None and deadline <= self.clock():
            self._shed_or_count(Shed(ShedReason.DEADLINE, priority), "deadline")
        headers = await self._rate_limit(scope, priority)
        if self.cap.try_acquire(priority, client):
            return _Admitted(priority, deadline, True, headers)
        label = "client_cap" if self.cap.client_full(client) else "capacity"
        self._shed_or_count(Shed(ShedReason.CAPACITY, priority), label)
        return _Admitted(priority, deadline, False, headers)

    def _classify(self, scope: Scope) -> tuple[Priority, float | None]:
        headers = scope["headers"]
        peer = scope.get("client")
        try:
            read_head(headers, _UPGRADE_HEAD)  # the one head parser: duplicate Host, sizes, ...
            priority, _ = self.classifier.classify(
                "GET", scope["path"], headers, peer[0] if peer else None
            )
            raw = next((v for n, v in headers if n == DEADLINE_HEADER), None)
            return priority, absolute_deadline(raw, self.clock(), None)
        except HeaderError as exc:
            bad = {"error": "bad_request", "message": str(exc), "header": exc.header}
            raise Refused(400, dict(bad), "bad_request") from None

    async def _rate_limit(self, scope: Scope, priority: Priority) -> list[tuple[bytes, bytes]]:
        """Spend from the upgrade's rate-limit bucket, as an HTTP GET would; the
        ``RateLimit`` headers for the accept (``rate_limit.headers: all``)."""
        runtime = self.ratelimit
        if runtime is None or not runtime.config.enabled:
            return []
        key, limits = runtime.resolver.resolve(scope)
        decision = await runtime.limiter.decide(key, limits)
        if not decision.allowed:
            self._shed_or_count(rate_limit_shed(decision, priority), "rate_limited")
            return []
        if runtime.config.headers != "all":
            return []
        return rate_limit_headers(decision, max(0, math.ceil(decision.reset_s)))

    def _shed_or_count(self, shed: Shed, label: str) -> None:
        """Raise ``_Shed``; in dry-run count the would-be shed and go on instead."""
        if self.responder.dry_run:
            self.responder.count_would_shed(None, shed.reason, shed.priority)
            return
        raise _Shed(shed, label)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, admitted: _Admitted) -> None:
        upstream = await open_upstream(
            scope, admitted.deadline, self.selector, self.config, self.clock
        )
        label = "error"
        try:
            await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol,
                        "headers": admitted.headers})  # fmt: skip
            relay = Relay(receive, send, upstream, limits=self.limits, budgets=self.budgets,
                          clock=self.clock)  # fmt: skip
            label = await relay.run()
            if label == "buffer_full":
                self.metrics.count_shed(ShedReason.CAPACITY, admitted.priority)
        finally:
            self.closed.labels(label).inc()
            if upstream.state is not State.CLOSED and upstream.transport is not None:
                upstream.transport.abort()

    async def _refuse(self, scope: Scope, send: Send, refusal: Refused) -> None:
        self.refused.labels(refusal.reason).inc()
        if _DENIAL not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(refusal.payload, separators=(",", ":")).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        await send({"type": "websocket.http.response.start", "status": refusal.status,
                    "headers": headers})  # fmt: skip
        await send({"type": "websocket.http.response.body", "body": body})

    async def _shed(self, scope: Scope, send: Send, shed: _Shed) -> None:
        """The shed response an HTTP request would get (or a close before the accept)."""
        self.refused.labels(shed.label).inc()
        if _DENIAL not in scope.get("extensions", {}):
            self.metrics.count_shed(shed.shed.reason, shed.shed.priority)
            await send({"type": "websocket.close", "code": 1013})
            return
        await self.responder.shed(_as_denial(send), shed.shed)


def _as_denial(send: Send) -> Send:
    """``send`` taking ``http.response.*`` messages as ``websocket.http.response.*``."""

    async def denial(message: Message) -> None:
        await send({**message, "type": "websocket." + message["type"]})

    return denial
