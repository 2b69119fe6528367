"""RateLimitMiddleware: refuse a request over its key's rate limit before it is queued.

The limits are the request's route's own (``ctx.route.rate_limit``, from
``routes[].rate_limit``) when it has them, else the ``rate_limit`` section's
(when enabled).

Placed inside admission (after the tier and deadline are known) and outside
the capacity cap and the queue: a refused request never holds a queue slot, a
permit or upstream work. The refusal is a ``Shed`` (``rate_limit_shed``) acted
on by the shared ``ShedResponder`` (status, ``X-Ballast-Reason: rate_limited``,
dry-run) with ``Retry-After`` from the bucket's refill time, plus the IETF
headers on the shed response
(draft-ietf-httpapi-ratelimit-headers)::

    RateLimit-Policy: "default";q=1000;w=1
    RateLimit: "default";r=0;t=1

``q``/``w`` state the sustained rate as a quota per window, ``r`` the whole
tokens left and ``t`` the seconds until the next request would be admitted.
Admitted responses carry the same two headers (``rate_limit.headers: all``,
the default) so a client can pace itself before it is refused;
``refused`` keeps them on 429s only.
On ``lifespan.startup`` a shared driver starts its loops and counts the live
gateways (bounded), so it does not decide as if alone until its first
heartbeat; on ``lifespan.shutdown`` it stops its loops and closes its connections.
"""

from __future__ import annotations

import math
from time import perf_counter

from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import ASGIApp, Message, Receive, Scope, Send
from ballast_asgi.middleware.context import find_context
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.ratelimit.core.gcra import Decision, Limits
from ballast_asgi.ratelimit.runtime import RateLimitRuntime


class RateLimitStage:
    """The rate-limit stage's decision: admit (with the IETF headers) or refuse."""

    __slots__ = ("responder", "runtime")

    def __init__(self, runtime: RateLimitRuntime, responder: ShedResponder) -> None:
        self.runtime = runtime
        self.responder = responder

    async def check(self, scope: Scope, send: Send) -> tuple[Send, Shed | None]:
        """The request's decision: ``send`` (with the headers of an admission) and no shed,
        or the ``rate_limited`` shed to act on."""
        rt = self.runtime
        ctx = find_context(scope)
        route = None if ctx is None else ctx.route
        own = None if route is None else route.rate_limit
        if own is not None and route is not None:
            key, limits = rt.resolver.resolve_route(scope, route.name, own.rate_per_s, own.burst)
        elif rt.config.enabled:
            key, limits = rt.resolver.resolve(scope)
        else:
            return send, None  # only routes with their own limit are limited
        limiter = rt.limiter
        start = perf_counter()
        decision = await limiter.decide(key, limits)
        limiter.stats.waited(perf_counter() - start)
        if decision.allowed:
            if rt.config.headers == "all":
                reset = max(0, math.ceil(decision.reset_s))
                send = _add_headers(send, rate_limit_headers(decision, reset))
            return send, None
        priority = self.responder.priority_of(ctx)
        return send, rate_limit_shed(decision, priority)

    def lifespan(self, receive: Receive) -> Receive:
        """``receive`` that starts the runtime's loops at startup and closes them at shutdown."""

        async def wrapped() -> Message:
            message = await receive()
            if message.get("type") == "lifespan.startup":
                await self.runtime.start()
            elif message.get("type") == "lifespan.shutdown":
                await self.runtime.close()
            return message

        return wrapped


class RateLimitMiddleware:
    """Per-key rate limits, local or shared through Redis (``RateLimitStage``)."""

    def __init__(
        self, app: ASGIApp, *, runtime: RateLimitRuntime, responder: ShedResponder
    ) -> None:
        self.app = app
        self.stage = RateLimitStage(runtime, responder)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Decide, then pass the request on or refuse it."""
        stage = self.stage
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                receive = stage.lifespan(receive)
            await self.app(scope, receive, send)
            return
        send, shed = await stage.check(scope, send)
        if shed is not None:
            await stage.responder.act(shed, find_context(scope), self.app, scope, receive, send)
            return
        await self.app(scope, receive, send)


def policy_header(limits: Limits) -> bytes:
    """``RateLimit-Policy`` for one bucket: its sustained rate as quota per window."""
    if limits.rate_per_s >= 1:
        quota, window = round(limits.rate_per_s), 1
    else:
        quota, window = 1, math.ceil(1 / limits.rate_per_s)
    return f'"{limits.name}";q={quota};w={window}'.encode()


def rate_limit_headers(decision: Decision, reset_s: int) -> list[tuple[bytes, bytes]]:
    """The IETF ``RateLimit-Policy`` and ``RateLimit`` headers for a decision."""
    name = decision.limits.name
    state = f'"{name}";r={decision.remaining};t={reset_s}'.encode()
    return [(b"ratelimit-policy", policy_header(decision.limits)), (b"ratelimit", state)]


def rate_limit_shed(decision: Decision, priority: Priority) -> Shed:
    """The shed for a refused decision: ``Retry-After`` the refill time, plus the IETF headers."""
    retry_after = max(1, math.ceil(decision.retry_after_s))
    headers = tuple(rate_limit_headers(decision, retry_after))
    return Shed(ShedReason.RATE_LIMITED, priority, retry_after, headers)


def _add_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """``send`` with ``extra`` appended to the response head's headers."""

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return wrapped
