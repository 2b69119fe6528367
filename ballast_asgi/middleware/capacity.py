"""CapacityMiddleware: shed at once when the gateway already holds too much.

Sits directly inside ``AdmissionMiddleware`` and outside ``QueueMiddleware``,
so dead-on-arrival and malformed requests are answered first and the queue
never grows past the cap. For each HTTP request it

1. reads the tier from the request context (STANDARD when there is none) and
   the declared ``Content-Length`` from the raw header list (0 when absent);
2. asks ``Capacity.try_enter`` (held-request cap with a critical reserve, and
   the buffered-bytes budget); on refusal it sheds with ``capacity`` through
   the shared ``ShedResponder``, before a byte of the body is read;
3. otherwise runs the inner app and calls ``Capacity.leave`` in ``finally``,
   exactly once, whatever the inner app did (returned, raised, was cancelled).

Dry-run (``responder.dry_run``): a request over the cap is counted in
``ballast_dry_run_shed_total`` and runs without entering (so nothing to leave);
so does one an outer stage already admitted that way (``ctx.would_shed``).
"""

from __future__ import annotations

from ballast_asgi.core.capacity import Capacity
from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import ASGIApp, Receive, Scope, Send
from ballast_asgi.middleware.context import find_context
from ballast_asgi.middleware.responses import ShedResponder

_CONTENT_LENGTH = b"content-length"


class CapacityMiddleware:
    """The held-requests and buffered-bytes cap."""

    def __init__(self, app: ASGIApp, *, capacity: Capacity, responder: ShedResponder) -> None:
        self.app = app
        self.capacity = capacity
        self.responder = responder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Hold the request while the inner app runs, or shed it with ``capacity``."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ctx = find_context(scope)
        if ctx is not None and ctx.would_shed:  # dry-run: admitted outside every limit
            await self.app(scope, receive, send)
            return
        priority = Priority.STANDARD if ctx is None else ctx.priority
        body_bytes = _content_length(scope)
        capacity = self.capacity
        if not capacity.try_enter(priority, body_bytes):
            if not await self.responder.refuse(send, ctx, ShedReason.CAPACITY, priority):
                await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            capacity.leave(body_bytes)


def _content_length(scope: Scope) -> int:
    """The declared body size (0 when absent or malformed: the proxy rejects those)."""
    for name, value in scope.get("headers") or ():
        if name == _CONTENT_LENGTH:
            return int(value) if value.isdigit() else 0
    return 0
