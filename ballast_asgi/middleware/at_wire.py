"""The stages' shed decision for a request head, before any ASGI work (issue 31).

``decide(stages, method, path, raw_path, headers, host)`` answers, for a
request whose head was just parsed by the server (``ballast_asgi/server/wire.py``),
whether the fused pipeline (``Pipeline``) would shed it *now*, and with which
``Shed``; None means "not decided here": the request goes the ordinary way and
the stages decide again as they always do. It walks the pipeline's order and
asks each stage the question its own code asks, through the same methods:

1. admission (``AdmissionMiddleware.read`` / ``decide``): ``deadline`` (dead on
   arrival) and ``early_drop``;
2. rate limit: a request the rate-limit stage decides (``rate_limit.enabled``
   or a route with its own limit) is left to it (its key is resolved from the
   scope, and its shared modes await Redis): None;
3. capacity (``Capacity.would_refuse``): ``capacity``;
4. a request with a body: None (the body stage reads it before the permit);
5. no free permit (``Limiter.full``): ``limit`` without a queue, ``queue_full``
   when the queue would refuse its tier outright (``PriorityQueue.would_refuse``;
   a displacement or a wait: None); a partitioned limiter whose table is full
   (eviction would decide): None;
6. a free permit: ``breaker_open`` when the route's breaker gives no ticket
   (``Breaker.can_acquire``) and the retry stage would not run the request
   (``retry.enabled`` false, or the route's ``max_attempts`` 1); else None.

Reading counts nothing. Only when a ``Shed`` is returned is the request
counted exactly as the ASGI path counts it up to its shed (route,
``ballast_requests_total``, an ignored X-Priority, ``Capacity.refused``, the
limiter's ``rejected``, ``ballast_queue_total{outcome="queue_full"}``, the
breaker stage's permit taken and handed back IGNORED); the responder counts
the shed itself (``ShedResponder.response``). Anything unusual (a malformed
head, a protocol switch, dry-run, an app route template) returns None: the
ASGI path answers it, byte for byte as before. Dry-run returns None: the
stages count and admit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.outcome import Outcome, ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.routes import Route
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import RawHeaders
from ballast_asgi.middleware.limit_route import limit_key

if TYPE_CHECKING:
    from ballast_asgi.middleware.pipeline import Stages

#: Counts what the ASGI path counts between admission and its shed.
Commit = Callable[[], None]


def decide(
    stages: Stages,
    method: str,
    path: str,
    raw_path: bytes | str,
    headers: RawHeaders,
    host: str | None,
    memo: list[object] | None = None,
) -> Shed | None:
    """The ``Shed`` the pipeline would answer now (counted), or None: not decided here.

    ``memo``: for a request read here and not shed, ``memo[0]`` is set to
    ``(admission, read, now)``; the server puts it in the request's scope under
    ``WIRE_READ`` and admission uses it instead of reading the head again.
    """
    admission = stages.admission
    if admission.responder.dry_run or admission.route_key is not None:
        return None
    now = admission.clock()
    try:
        head, route, priority, ignored, deadline = admission.read(
            method, path, raw_path, headers, host, now, count=False
        )
    except HeaderError:
        return None
    if head.upgrade:
        return None
    commit: Commit | None = None
    shed = admission.decide(deadline, priority, now)
    if shed is None:
        later = _after_admission(stages, route, priority, head.has_body, host, path, now)
        if later is None:
            if memo is not None:
                memo[0] = (admission, (head, route, priority, ignored, deadline), now)
            return None
        shed, commit = later
    admission.count(route, priority, ignored)
    if commit is not None:
        commit()
    return shed


def _after_admission(
    stages: Stages,
    route: Route,
    priority: Priority,
    has_body: bool,
    host: str | None,
    path: str,
    now: float,
) -> tuple[Shed, Commit] | None:
    """The shed of the stages after admission, in the pipeline's order (None: not here)."""
    if stages.ratelimit is not None and (
        route.rate_limit is not None or stages.ratelimit.runtime.config.enabled
    ):
        return None
    capacity = stages.capacity.capacity
    if capacity.would_refuse(priority):

        def refuse_capacity() -> None:
            if capacity.try_enter(priority):  # counts the refusal; never admits here
                capacity.leave()

        return Shed(ShedReason.CAPACITY, priority), refuse_capacity
    if has_body:
        return None
    concurrency = stages.concurrency
    limiter = concurrency.limiter
    key = limit_key(route, path)

    def refuse_permit() -> None:
        """``try_acquire`` as the concurrency stage calls it: refuses, counts ``rejected``."""
        permit = limiter.try_acquire(now, key)
        if permit is not None:  # never: the limiter was full a moment ago, same loop turn
            permit.release(Outcome.IGNORED, now)

    full = limiter.full(now, key)
    if full is None:
        return None
    if full:
        queue = stages.queue
        if queue is None:
            return Shed(ShedReason.LIMIT, priority), refuse_permit
        if not queue.queue.would_refuse(priority):
            return None

        def queue_full() -> None:
            refuse_permit()
            queue.metrics.count_queued("queue_full")

        return Shed(ShedReason.QUEUE_FULL, priority), queue_full
    retry = stages.retry
    if retry is not None and retry.replays(route):
        return None
    breaker = stages.breaker.breakers.get(route.name)
    if breaker.can_acquire(now, host):
        return None
    shed = Shed(ShedReason.BREAKER_OPEN, priority, breaker.retry_after_s(now))

    def handed_back() -> None:
        """The breaker stage's shed: the permit taken, then handed back IGNORED."""
        permit = limiter.try_acquire(now, key)
        if permit is not None:
            permit.release(Outcome.IGNORED, now)

    return shed, handed_back


__all__ = ["decide"]
