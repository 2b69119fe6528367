"""WebSocket upgrades through the gateway: admitted at the upgrade, then frames both ways.

The HTTP stages pass ``websocket`` scopes through untouched; the gateway
sends them here. At the upgrade (``websocket.connect``):

1. turned off (``websocket.enabled: false``): refused with 403 and one log line;
2. ``X-Priority`` (through the same ``Classifier`` as HTTP: trusted peers only)
   and ``X-Deadline-Ms`` are parsed; a malformed one is a 400 naming it;
3. the connection takes a slot of its own cap (``websocket.max_connections``,
   a ``reserved_fraction`` kept for the critical tier), never a concurrency
   permit: a connection that lives for minutes is not an RTT sample. Full:
   429 with ``Retry-After`` and ``X-Ballast-Reason: capacity`` (counted in
   ``ballast_shed_total``);
4. the upstream handshake is made (same upstream selector as HTTP, URL built
   from the upstream's parts and the origin-form target; client headers
   forwarded minus hop-by-hop and ``Sec-WebSocket-*``, subprotocols offered
   as the client offered them; bounded by ``open_timeout_ms`` and the
   deadline). Failure: 502 (504 on timeout), the upstream's status when it
   refused the upgrade.

Refusals use the ASGI ``websocket.http.response`` extension (uvicorn has it)
so the client sees a real status; without it the server answers 403.

Then both directions are pumped until either side closes; the close code and
reason are passed on (codes that cannot be sent, 1005/1006/1015, become 1000
for "no status", 1011 for an upstream that vanished, 1001 for a client that did).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from prometheus_client import Counter, Gauge
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from ballast_asgi.config.models import WebSocketConfig
from ballast_asgi.core.classify import Classifier
from ballast_asgi.core.connections import ConnectionCap
from ballast_asgi.core.deadline import DEADLINE_HEADER, absolute_deadline
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.outcome import (
    DEFAULT_FAILURE_STATUSES,
    AttemptOutcome,
    ShedReason,
    status_outcome,
)
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import Clock, Receive, Scope, Send
from ballast_asgi.metrics import Metrics
from ballast_asgi.proxy.headers import origin_form, raw_target, request_headers
from ballast_asgi.proxy.upstream import Selector

__all__ = ["WebSocketProxy"]

log = logging.getLogger("ballast.websocket")
_DENIAL = "websocket.http.response"
#: Close codes an endpoint may not put in a close frame.
_UNSENDABLE = frozenset({1004, 1005, 1006, 1015})


class _Refused(Exception):
    def __init__(self, status: int, payload: dict[str, object], reason: str) -> None:
        super().__init__(reason)
        self.status, self.payload, self.reason = status, payload, reason


class WebSocketProxy:
    """Admit a websocket upgrade, open the upstream one, relay frames and the close."""

    def __init__(
        self,
        *,
        config: WebSocketConfig,
        selector: Selector,
        classifier: Classifier,
        metrics: Metrics,
        default_priority: Priority = Priority.STANDARD,
        clock: Clock = time.monotonic,
    ) -> None:
        self.config = config
        self.selector = selector
        self.classifier = classifier
        self.metrics = metrics
        self.default_priority = default_priority
        self.clock = clock
        self.cap = ConnectionCap(config.max_connections, config.reserved_fraction)
        self.open_gauge = Gauge(
            "ballast_websocket_connections", "Open proxied websocket connections.",
            registry=metrics.registry,
        )  # fmt: skip
        self.refused = Counter(
            "ballast_websocket_refused", "Websocket upgrades refused, by reason.", ["reason"],
            registry=metrics.registry,
        )  # fmt: skip
        self.open_gauge.set_function(lambda: self.cap.open)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        try:
            deadline = self._admit(scope)
        except _Refused as refusal:
            await self._refuse(scope, send, refusal)
            return
        try:
            await self._serve(scope, receive, send, deadline)
        except _Refused as refusal:
            await self._refuse(scope, send, refusal)
        finally:
            self.cap.release()

    def _admit(self, scope: Scope) -> float | None:
        """The deadline of an admitted upgrade (a cap slot taken); ``_Refused`` otherwise."""
        if not self.config.enabled:
            log.warning("websocket upgrade refused (websocket.enabled is false): %s", scope["path"])
            raise _Refused(403, {"error": "websockets_disabled"}, "disabled")
        if not origin_form(scope):
            payload: dict[str, object] = {"error": "bad_request", "message": "bad target"}
            raise _Refused(400, payload, "bad_request")
        headers = scope["headers"]
        client = scope.get("client")
        now = self.clock()
        try:
            priority, _ = self.classifier.classify(
                "GET", scope["path"], headers, client[0] if client else None
            )
            raw = next((v for n, v in headers if n == DEADLINE_HEADER), None)
            deadline = absolute_deadline(raw, now, None)
        except HeaderError as exc:
            bad = {"error": "bad_request", "message": str(exc), "header": exc.header}
            raise _Refused(400, dict(bad), "bad_request") from None
        if deadline is not None and deadline <= now:
            self.metrics.count_shed(ShedReason.DEADLINE, priority)
            raise _Refused(429, _shed(ShedReason.DEADLINE), "deadline")
        if not self.cap.try_acquire(priority):
            self.metrics.count_shed(ShedReason.CAPACITY, priority)
            raise _Refused(429, _shed(ShedReason.CAPACITY), "capacity")
        return deadline

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, deadline: float | None
    ) -> None:
        upstream = await self._open(scope, deadline)
        try:
            await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
            await _relay(receive, send, upstream)
        finally:
            await upstream.close()

    async def _open(self, scope: Scope, deadline: float | None) -> ClientConnection:
        """The upstream connection; the handshake's outcome is reported to the selector.

        The attempt ends at the handshake, as an HTTP attempt ends at its
        response head: a pooled instance's permit and outlier statistics cover
        the upgrade, not the minutes the connection may then live.
        """
        target = self.selector.choose(None)
        url = target.url(raw_target(scope)).copy_with(
            scheme="wss" if target.scheme == "https" else "ws"
        )
        start = self.clock()
        timeout = self.config.open_timeout_ms / 1000.0
        by_deadline = deadline is not None and deadline - start < timeout
        if deadline is not None:
            timeout = max(0.001, min(timeout, deadline - start))
        outcome = AttemptOutcome.GATEWAY_ERROR
        try:
            connection: ClientConnection = await asyncio.wait_for(
                self._connect(str(url), scope), timeout
            )
            outcome = AttemptOutcome.SUCCESS
            return connection
        except TimeoutError:
            outcome = AttemptOutcome.DEADLINE if by_deadline else AttemptOutcome.TIMEOUT
            raise _Refused(504, {"error": "gateway_timeout"}, "upstream_timeout") from None
        except InvalidStatus as exc:
            status = exc.response.status_code
            outcome = status_outcome(status, DEFAULT_FAILURE_STATUSES)
            raise _Refused(status, {"error": "upstream_refused"}, "upstream_refused") from None
        except OSError:
            outcome = AttemptOutcome.CONNECT_ERROR
            raise _Refused(502, {"error": "bad_gateway"}, "upstream_error") from None
        except WebSocketException:
            outcome = AttemptOutcome.PROTOCOL_ERROR
            raise _Refused(502, {"error": "bad_gateway"}, "upstream_error") from None
        except asyncio.CancelledError:
            outcome = AttemptOutcome.CLIENT_GONE
            raise
        finally:
            now = self.clock()
            self.selector.report(target, outcome, now - start, now)

    def _connect(self, url: str, scope: Scope) -> Any:
        secure = scope.get("scheme") == "wss"
        http_scope = {**scope, "scheme": "https" if secure else "http"}
        headers = [
            (n.decode("latin-1"), v.decode("latin-1"))
            for n, v in request_headers(http_scope, False)
            if not n.startswith(b"sec-websocket-")
        ]
        return connect(
            url,
            additional_headers=headers,
            subprotocols=scope.get("subprotocols") or None,
            compression=None,
            user_agent_header=None,
            proxy=None,
            open_timeout=None,
            max_size=self.config.max_message_bytes,
        )

    async def _refuse(self, scope: Scope, send: Send, refusal: _Refused) -> None:
        self.refused.labels(refusal.reason).inc()
        if _DENIAL not in scope.get("extensions", {}):
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps(refusal.payload, separators=(",", ":")).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]  # fmt: skip
        if refusal.status == 429:
            headers += [(b"retry-after", b"1"), (b"x-ballast-reason", refusal.reason.encode())]
        await send({"type": "websocket.http.response.start", "status": refusal.status,
                    "headers": headers})  # fmt: skip
        await send({"type": "websocket.http.response.body", "body": body})


def _shed(reason: ShedReason) -> dict[str, object]:
    return {"error": "shed", "reason": reason.value}


async def _relay(receive: Receive, send: Send, upstream: ClientConnection) -> None:
    """Pump frames both ways until one side closes, then pass the close on."""
    tasks = [asyncio.ensure_future(_client_to_upstream(receive, upstream)),
             asyncio.ensure_future(_upstream_to_client(send, upstream))]  # fmt: skip
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _client_to_upstream(receive: Receive, upstream: ClientConnection) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.receive":
            text = message.get("text")
            try:
                await upstream.send(text if text is not None else message.get("bytes") or b"")
            except ConnectionClosed:
                return
        elif message["type"] == "websocket.disconnect":
            code = _sendable(message.get("code", 1000), vanished=1001)
            await upstream.close(code, message.get("reason") or "")
            return


async def _upstream_to_client(send: Send, upstream: ClientConnection) -> None:
    try:
        async for data in upstream:
            key = "text" if isinstance(data, str) else "bytes"
            await send({"type": "websocket.send", key: data})
    except ConnectionClosed:
        pass
    except OSError:
        return  # the client is gone; the other task sees its disconnect
    code = _sendable(upstream.close_code or 1006, vanished=1011)
    reason = upstream.close_reason or ""
    try:
        await send({"type": "websocket.close", "code": code, "reason": reason})
    except OSError:
        return


def _sendable(code: int, *, vanished: int) -> int:
    """A close code that may go in a close frame (1005 -> 1000; 1006/1015 -> ``vanished``)."""
    if code == 1005:
        return 1000
    if code in _UNSENDABLE or not (1000 <= code <= 1014 or 3000 <= code <= 4999):
        return vanished
    return code
