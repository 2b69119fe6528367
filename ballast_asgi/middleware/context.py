"""The per-request context that the stages share, and how they find it in scope.

The admission stage (the outermost shedding stage) creates one
``RequestContext`` per request and passes a *copy* of the scope down with the
context under ``scope["ballast"]`` and ``scope["state"]["ballast"]`` (so a
FastAPI handler can read ``request.state.ballast``). Inner stages call
``get_context(scope)``, which fails with a clear message when admission is
missing from the stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ballast_asgi.core.errors import ContextMissingError
from ballast_asgi.core.outcome import AttemptOutcome, Outcome, ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import Scope

if TYPE_CHECKING:
    from ballast_asgi.core.limiter import Permit

SCOPE_KEY = "ballast"


@dataclass(slots=True, eq=False)
class RequestContext:
    """Everything the stages know about one request."""

    #: Monotonic arrival time (seconds).
    arrival: float
    #: Absolute deadline on the monotonic clock, or None for no deadline.
    deadline: float | None
    priority: Priority
    #: The concurrency permit, once granted (by the queue or the limiter stage).
    permit: Permit | None = None
    #: Upstream attempt number, 0 for the original.
    attempt: int = 0
    #: Seconds spent waiting in the priority queue.
    queue_wait_s: float = 0.0
    #: Set by inner stages: the outcome the limiter should record.
    outcome: Outcome | None = None
    #: Set by the proxy on failure: "connect", "protocol", "timeout", or None.
    upstream_error: str | None = None
    #: Set when the request was shed.
    shed_reason: ShedReason | None = None
    #: Set when the client disconnected before the response completed.
    client_gone: bool = False
    #: Dry-run: the reasons this request would have been shed for.
    would_shed: list[ShedReason] = field(default_factory=list)
    #: How the current attempt ended; set by the proxy (or app) before the response head.
    attempt_outcome: AttemptOutcome | None = None
    #: The current attempt's time to the response head (seconds); None without a head.
    head_rtt_s: float | None = None
    #: The upstreams earlier attempts of this request went to (the selector's ``exclude``).
    tried_upstreams: tuple[object, ...] = ()


def with_context(scope: Scope, ctx: RequestContext) -> Scope:
    """A shallow copy of ``scope`` carrying ``ctx`` (the original is untouched)."""
    child = dict(scope)
    state = dict(scope.get("state") or {})
    state[SCOPE_KEY] = ctx
    child["state"] = state
    child[SCOPE_KEY] = ctx
    return child


def find_context(scope: Scope) -> RequestContext | None:
    """The request's context, or None when no admission stage created one."""
    ctx = scope.get(SCOPE_KEY)
    return ctx if isinstance(ctx, RequestContext) else None


def get_context(scope: Scope) -> RequestContext:
    """The request's context; raises ``ContextMissingError`` naming the fix."""
    ctx = find_context(scope)
    if ctx is None:
        raise ContextMissingError(
            "no ballast RequestContext in scope: add AdmissionMiddleware outside "
            "(before) the queue, concurrency and breaker stages, or use ballast_asgi.install()"
        )
    return ctx
