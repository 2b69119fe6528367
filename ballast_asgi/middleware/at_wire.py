"""The stages' shed decision for a request head, before any ASGI work (issue 31).

``decide(stages, method, path, raw_path, headers, host)`` (``WireDecision``:
the same with the stages' collaborators read once, one per ``Pipeline``) answers, for a
request whose head was just parsed by the server (``ballast_asgi/server/wire.py``),
whether the fused pipeline (``Pipeline``) would shed it *now*, and with which
``Shed``; None means "not decided here": the request goes the ordinary way and
the stages decide again as they always do. It walks the pipeline's order and
asks each stage the question its own code asks, through the same methods:

1. admission (``AdmissionStage.read`` / ``decide``): ``deadline`` (dead on
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
from functools import partial
from typing import TYPE_CHECKING

from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.outcome import Outcome, ShedReason
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.routes import Route
from ballast_asgi.core.shed import Shed
from ballast_asgi.core.types import RawHeaders
from ballast_asgi.middleware.limit_route import limit_key

if TYPE_CHECKING:
    from ballast_asgi.core.capacity import Capacity
    from ballast_asgi.core.limiter import Limiter
    from ballast_asgi.middleware.pipeline import Stages
    from ballast_asgi.telemetry.metrics import Metrics

#: Counts what the ASGI path counts between admission and its shed.
Commit = Callable[[], None]


class WireDecision:
    """``decide`` for one pipeline's stages, their collaborators read once (``Pipeline.wire``).

    A ``Pipeline`` keeps one (its stages are fixed); ``decide(stages, ...)`` builds
    one per call. What a stage may change live (dry-run, a rate-limit reload) is read
    per request, as the stages read it.
    """

    __slots__ = ("admission", "breakers", "capacity", "limiter", "queue", "ratelimit", "retry")

    def __init__(self, stages: Stages) -> None:
        self.admission = stages.admission.stage
        self.ratelimit = None if stages.ratelimit is None else stages.ratelimit.stage
        self.capacity: Capacity = stages.capacity.stage.capacity
        self.limiter: Limiter = stages.concurrency.stage.limiter
        self.queue = None if stages.queue is None else stages.queue.stage
        self.retry = None if stages.retry is None else stages.retry.stage
        self.breakers = stages.breaker.stage.breakers

    def decide(
        self,
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
        admission = self.admission
        if admission.responder.dry_run or admission.route_key is not None:
            return None
        now = admission.clock()
        try:
            head, route, priority, ignored, deadline = admission.read(
                method, path, raw_path, headers, host, now, None, False
            )  # no template (``route_key`` is None), counted only when shed
        except HeaderError:
            return None
        if head.upgrade:
            return None
        commit: Commit | None = None
        shed = None if deadline is None else admission.decide(deadline, priority, now)
        if shed is None:
            later = self._after_admission(route, priority, head.has_body, host, path, now)
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
        self,
        route: Route,
        priority: Priority,
        has_body: bool,
        host: str | None,
        path: str,
        now: float,
    ) -> tuple[Shed, Commit] | None:
        """The shed of the stages after admission, in the pipeline's order (None: not here).

        The commits are built only for a shed (a request that goes on costs no closure).
        """
        ratelimit = self.ratelimit
        if ratelimit is not None and (
            route.rate_limit is not None or ratelimit.runtime.config.enabled
        ):
            return None
        capacity = self.capacity
        if capacity.would_refuse(priority):
            refuse = partial(_refuse_capacity, capacity, priority)
            return Shed(ShedReason.CAPACITY, priority), refuse
        if has_body:
            return None
        limiter = self.limiter
        key = limit_key(route, path)
        full = limiter.full(now, key)
        if full is None:
            return None
        if full:
            queue = self.queue
            if queue is None:
                refused = partial(_take_and_return, limiter, now, key)
                return Shed(ShedReason.LIMIT, priority), refused
            if not queue.queue.would_refuse(priority):
                return None
            commit = partial(_queue_full, limiter, now, key, queue.metrics)
            return Shed(ShedReason.QUEUE_FULL, priority), commit
        retry = self.retry
        if retry is not None and retry.replays(route):
            return None
        breaker = self.breakers.get(route.name)
        if breaker.can_acquire(now, host):
            return None
        shed = Shed(ShedReason.BREAKER_OPEN, priority, breaker.retry_after_s(now))
        # The breaker stage's shed: the permit it was given goes back at once, IGNORED.
        return shed, partial(_take_and_return, limiter, now, key)


def decide(
    stages: Stages,
    method: str,
    path: str,
    raw_path: bytes | str,
    headers: RawHeaders,
    host: str | None,
    memo: list[object] | None = None,
) -> Shed | None:
    """The ``Shed`` the pipeline of ``stages`` would answer now (counted), or None: not
    decided here (``WireDecision.decide``; a ``Pipeline`` keeps its own)."""
    return WireDecision(stages).decide(method, path, raw_path, headers, host, memo)


def _refuse_capacity(capacity: Capacity, priority: Priority) -> None:
    """``try_enter`` as the capacity stage calls it: refuses and counts the refusal."""
    if capacity.try_enter(priority):  # never: it was full a moment ago, same loop turn
        capacity.leave()


def _take_and_return(limiter: Limiter, now: float, key: str) -> None:
    """``try_acquire`` as the concurrency stage calls it (a full limiter refuses and counts
    ``rejected``); a permit it gives (the breaker's case) is handed back IGNORED."""
    permit = limiter.try_acquire(now, key)
    if permit is not None:
        permit.release(Outcome.IGNORED, now)


def _queue_full(limiter: Limiter, now: float, key: str, metrics: Metrics) -> None:
    """The queue stage's refusal: no permit, then ``ballast_queue_total{queue_full}``."""
    _take_and_return(limiter, now, key)
    metrics.count_queued("queue_full")


__all__ = ["WireDecision", "decide"]
