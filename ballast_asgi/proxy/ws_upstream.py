"""The upstream side of a websocket upgrade: the handshake, bounded, and its outcome.

``open_upstream`` picks the upstream through the same ``Selector`` as HTTP,
builds the ``ws``/``wss`` URL from its parts and the origin-form target,
forwards the client's headers minus hop-by-hop and ``Sec-WebSocket-*``, offers
the client's subprotocols, and bounds the handshake by ``open_timeout_ms`` and
the deadline. The attempt ends at the handshake (as an HTTP attempt ends at
its response head) and its outcome goes to the selector. A failed handshake is
``Refused``: 504 on timeout, the upstream's status when it refused the
upgrade, 502 otherwise. Admission and the relay are ``websocket.py`` and
``ws_relay.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus, WebSocketException

from ballast_asgi.config.models import WebSocketConfig
from ballast_asgi.core.outcome import DEFAULT_FAILURE_STATUSES, AttemptOutcome, status_outcome
from ballast_asgi.core.types import Clock, Scope
from ballast_asgi.proxy.headers import raw_target, request_headers
from ballast_asgi.proxy.upstream import Selector

__all__ = ["Refused", "open_upstream"]

#: Frames the upstream client buffers as they arrive (websockets' high-water mark; its
#: default is 16): the relay reads them on, counted, as fast as the client takes them.
_UPSTREAM_MAX_QUEUE = 2


class Refused(Exception):
    """An upgrade answered with an error response (``status``, a JSON ``payload``)."""

    def __init__(self, status: int, payload: dict[str, object], reason: str) -> None:
        super().__init__(reason)
        self.status, self.payload, self.reason = status, payload, reason


async def open_upstream(
    scope: Scope,
    deadline: float | None,
    selector: Selector,
    config: WebSocketConfig,
    clock: Clock,
) -> ClientConnection:
    """The upstream connection; the handshake's outcome is reported to the selector.

    The attempt ends at the handshake, as an HTTP attempt ends at its
    response head: a pooled instance's permit and outlier statistics cover
    the upgrade, not the minutes the connection may then live.
    """
    target = selector.choose(None)
    url = target.url(raw_target(scope)).copy_with(
        scheme="wss" if target.scheme == "https" else "ws"
    )
    start = clock()
    timeout = config.open_timeout_ms / 1000.0
    by_deadline = deadline is not None and deadline - start < timeout
    if deadline is not None:
        timeout = max(0.001, min(timeout, deadline - start))
    outcome = AttemptOutcome.GATEWAY_ERROR
    try:
        async with asyncio.timeout(timeout):  # not wait_for: it can lose a cancellation
            connection: ClientConnection = await _connect(str(url), scope, config)
        outcome = AttemptOutcome.SUCCESS
        return connection
    except TimeoutError:
        outcome = AttemptOutcome.DEADLINE if by_deadline else AttemptOutcome.TIMEOUT
        raise Refused(504, {"error": "gateway_timeout"}, "upstream_timeout") from None
    except InvalidStatus as exc:
        status = exc.response.status_code
        outcome = status_outcome(status, DEFAULT_FAILURE_STATUSES)
        raise Refused(status, {"error": "upstream_refused"}, "upstream_refused") from None
    except OSError:
        outcome = AttemptOutcome.CONNECT_ERROR
        raise Refused(502, {"error": "bad_gateway"}, "upstream_error") from None
    except WebSocketException:
        outcome = AttemptOutcome.PROTOCOL_ERROR
        raise Refused(502, {"error": "bad_gateway"}, "upstream_error") from None
    except asyncio.CancelledError:
        outcome = AttemptOutcome.CLIENT_GONE
        raise
    finally:
        now = clock()
        selector.report(target, outcome, now - start, now)


def _connect(url: str, scope: Scope, config: WebSocketConfig) -> Any:
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
        max_size=config.max_message_bytes,
        max_queue=_UPSTREAM_MAX_QUEUE,
        close_timeout=config.close_timeout_ms / 1000.0,
    )
