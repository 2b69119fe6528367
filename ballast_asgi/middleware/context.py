"""The per-request context that the stages share, and how they find it in scope.

The admission stage (the outermost shedding stage) creates one
``RequestContext`` per request and passes a *copy* of the scope down with the
context under ``scope["ballast"]`` and ``scope["state"]["ballast"]`` (so a
FastAPI handler can read ``request.state.ballast``). Inner stages call
``get_context(scope)``, which fails with a clear message when admission is
missing from the stack.

Who writes what (one writer per field):

* admission: ``arrival``, ``deadline``, ``priority``, ``head`` (the request
  headers the stages need, parsed once), ``route`` (the matched
  ``core.routes.Route``, immutable: ``ctx.route.name`` is the breaker key and
  the ``route`` label, ``ctx.route.limiter_partition`` says whether the route
  has a limiter partition of its own; matched once, never again);
* the body stage: ``body`` (the replayable request body, when it fits);
* the queue / concurrency stage: ``permit``, ``queue_wait_s``;
* the retry stage: ``attempt`` (through ``next_attempt``);
* the proxy's selector seam: ``tried_upstreams``;
* whoever produced the response (the proxy, or the in-app handler stage):
  ``outcome`` and ``rtt_s`` through ``record``, once per attempt, before the
  response head is sent;
  (``record_status`` for a response head);
* the shed point (``ShedResponder``): ``shed_reason`` / ``would_shed``;
* the lane (``gateway/lane.py``), handing a request it began to the ASGI path:
  ``ticket`` (taken by the breaker stage) and ``prefetched`` (taken by the proxy).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ballast_asgi.core.errors import ContextMissingError
from ballast_asgi.core.head import NO_HEAD, RequestHead
from ballast_asgi.core.outcome import (
    DEFAULT_FAILURE_STATUSES,
    AttemptOutcome,
    ShedReason,
    status_outcome,
)
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import Clock, Scope

if TYPE_CHECKING:
    from ballast_asgi.core.breaker_ticket import Ticket
    from ballast_asgi.core.limiter import Permit
    from ballast_asgi.core.routes import Route

SCOPE_KEY = "ballast"


@dataclass(slots=True, eq=False)
class RequestContext:
    """Everything the stages know about one request."""

    #: Monotonic arrival time (seconds).
    arrival: float
    #: Absolute deadline on the monotonic clock, or None for no deadline.
    deadline: float | None
    priority: Priority
    #: The request headers the stages need (parsed once at admission).
    head: RequestHead = NO_HEAD
    #: The request's route and its resolved policy (None: no route table in the stack).
    route: Route | None = None
    #: The concurrency permit, once granted (by the queue or the limiter stage).
    permit: Permit | None = None
    #: Upstream attempt number, 0 for the original.
    attempt: int = 0
    #: Seconds spent waiting in the priority queue.
    queue_wait_s: float = 0.0
    #: How the current attempt ended (recorded once, by whoever produced the response).
    outcome: AttemptOutcome | None = None
    #: The current attempt's time to the response head (the limiter's RTT sample).
    rtt_s: float | None = None
    #: The request body, buffered in full by the body stage (None: not buffered).
    body: bytes | None = None
    #: Set when the request was shed.
    shed_reason: ShedReason | None = None
    #: Dry-run: the reasons this request would have been shed for.
    would_shed: list[ShedReason] = field(default_factory=list)
    #: The upstreams earlier attempts of this request went to (the selector's ``exclude``).
    tried_upstreams: tuple[object, ...] = ()
    #: The clock ``deadline`` is on (``remaining_ms`` reads it).
    clock: Clock = time.monotonic
    #: Response statuses that make an attempt a failure (``breaker.failure_statuses``).
    failure_statuses: frozenset[int] = DEFAULT_FAILURE_STATUSES
    #: Set by admission on a request of the route ``other``: ``(path, status)`` of a
    #: response head, so the route table can give a known segment its group.
    learn_route: Callable[[str, int], None] | None = None
    #: The lane (``gateway/lane.py``) took the first attempt's breaker ticket and handed
    #: the request to the ASGI path: the breaker stage uses this ticket, once.
    ticket: Ticket | None = None
    #: ... and sent the first attempt: ``(upstream, its result as a done future, the
    #: clock when it was sent)``; the proxy takes it, once, instead of calling again.
    prefetched: tuple[Any, Any, float] | None = None

    def record(self, outcome: AttemptOutcome, rtt_s: float | None = None) -> None:
        """Record how the current attempt ended; the first record of an attempt wins."""
        if self.outcome is None:
            self.outcome = outcome
            self.rtt_s = rtt_s

    def status_outcome(self, status: int) -> AttemptOutcome:
        """The outcome of a response head with ``status`` (``failure_statuses`` decide)."""
        return status_outcome(status, self.failure_statuses)

    def record_status(self, status: int, rtt_s: float | None = None) -> None:
        """Record an attempt that got a response head with ``status``."""
        self.record(status_outcome(status, self.failure_statuses), rtt_s)

    def next_attempt(self) -> None:
        """Start another attempt: a fresh, unrecorded outcome."""
        self.attempt += 1
        self.outcome = None
        self.rtt_s = None

    def remaining_ms(self) -> float | None:
        """Milliseconds left before the deadline (<= 0 once passed); None without one.

        For handlers that pass the budget on (e.g. as ``X-Deadline-Ms`` of a call they make).
        """
        if self.deadline is None:
            return None
        return (self.deadline - self.clock()) * 1000.0


#: The admitted request the running task serves: set by the in-app handler stage
#: (``install``/``wrap``) around the user's handlers, so an outgoing call
#: (``ballast_asgi.client.BallastTransport``) finds its deadline and tier without
#: the caller passing anything. Tasks the handler starts inherit it (as asyncio
#: copies contexts): their calls share the request's deadline.
CURRENT_CONTEXT: ContextVar[RequestContext | None] = ContextVar("ballast_request", default=None)

#: The running ASGI task's request cycle when the gateway's own server runs it
#: (``server/cycle.py`` sets it; None under any other server). The proxy registers
#: ``cycle.on_gone = cycle.stop`` while it waits for the upstream's head: a client that
#: leaves then cancels that wait (the upstream connection closed), instead of the
#: upstream working on until the deadline for an answer nobody reads.
LEAVING: ContextVar[Any] = ContextVar("ballast_leaving", default=None)


def current_context() -> RequestContext | None:
    """The context of the admitted request this task serves, or None outside one."""
    return CURRENT_CONTEXT.get()


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
