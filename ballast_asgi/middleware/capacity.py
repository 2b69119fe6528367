"""CapacityMiddleware: shed at once when the gateway already holds too much.

Sits directly inside ``AdmissionMiddleware`` and outside ``QueueMiddleware``,
so dead-on-arrival and malformed requests are answered first and the queue
never grows past the cap. For each HTTP request it

1. reads the tier from the request context (STANDARD when there is none);
2. asks ``Capacity.try_enter`` (held-request cap with a critical reserve); on
   refusal it sheds with ``capacity`` through the shared ``ShedResponder``,
   before a byte of the body is read. Bytes are not reserved here: the body
   stage and the retry stage count in the byte budget what they actually
   buffer, as they buffer it (a declared Content-Length reserves nothing, so
   an idle upload cannot hold the budget);
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
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import ASGIApp, Receive, Scope, Send
from ballast_asgi.middleware.context import RequestContext, find_context
from ballast_asgi.middleware.responses import ShedResponder


class CapacityStage:
    """The capacity stage's decisions: enter, leave, and the ``capacity`` shed."""

    __slots__ = ("capacity", "responder")

    def __init__(self, capacity: Capacity, responder: ShedResponder) -> None:
        self.capacity = capacity
        self.responder = responder

    async def refuse(
        self, ctx: RequestContext | None, priority: Priority, app: ASGIApp, scope: Scope,
        receive: Receive, send: Send,
    ) -> None:  # fmt: skip
        """Act on the ``capacity`` shed of a request ``try_enter`` refused (dry-run: ``app``)."""
        shed = Shed(ShedReason.CAPACITY, priority)
        await self.responder.act(shed, ctx, app, scope, receive, send)


class CapacityMiddleware:
    """The held-requests and buffered-bytes cap (``CapacityStage`` as a middleware)."""

    def __init__(self, app: ASGIApp, *, capacity: Capacity, responder: ShedResponder) -> None:
        self.app = app
        self.stage = CapacityStage(capacity, responder)

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
        stage = self.stage
        capacity = stage.capacity
        if not capacity.try_enter(priority):
            await stage.refuse(ctx, priority, self.app, scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            capacity.leave()
