"""The lane (ADR 0020): the common proxied request, served with callbacks (issue 31 item 2).

Under load most requests are the same request: a GET through the plain stack
to the one upstream. On the ASGI path each costs a task, a request cycle's
coroutines, one coroutine per stage and per proxy layer, and a future per
upstream exchange. The lane serves that request from the server protocol
instead: ``GuardedHttpToolsProtocol.on_headers_complete`` (``server/guarded.py``)
has built the request's scope and ``ResponseCycle`` as always, and, before it
starts the ASGI task, offers the request to ``Gateway.serve_in_lane`` ->
``Lane.start``. The lane runs the same stages, by their own methods, in the
same order, and nothing else:

1. ``Pipeline.enter``: admission (the head read once, counted), capacity and
   the permit, exactly as the ASGI path enters them; when one of them answers
   or waits (a refusal, a shed, a body, the rate-limit check, the queue), what
   runs instead runs as an ASGI task on this cycle (``ResponseCycle.start``):
   the ASGI path from that point on.
2. The first attempt: the retry stage's ``begin`` (counts an original), the
   breaker stage's ticket (the route's breaker, the client's address), the
   upstream request written on an idle pooled lean connection
   (``LanedProxy.begin``). Whatever of that cannot be done without waiting (no
   ticket to give, no idle connection, the deadline spent) hands the request
   to ``Pipeline.permitted`` as an ASGI task, with what the lane took already
   on the context (``ctx.ticket``): the ASGI path goes on from there.
3. The response head (``LeanResponse`` tells ``told``): the common answer
   (``LanedProxy.check`` and ``answer``: a whole body of at most 16 KiB, or
   none, not a retryable failure while retries may run) is recorded, the ticket settled
   at the head (``BreakerStage.at_head``), and the head and body are handed to
   the cycle's ``deliver``: uvicorn's ``send``, the same bytes. Then the
   permit is released with the attempt's signal (``finish``) and the capacity
   slot left, as the ASGI path's ``finally`` does. Anything else (a head to
   stream, a retryable failure, an upstream error or timeout, a client that
   does not read) goes to the ASGI path with the attempt's result on the
   context (``ctx.prefetched``): the proxy takes it instead of calling again,
   and the retry and breaker stages decide as they always do.

So every count, sample and byte is the ASGI path's: the lane is an order of
the same calls, not a copy of the decisions. ``tests/middleware/test_compositions.py``
plays one script through the per-stage middlewares, the fused pipeline and the
lane; ``tests/server/test_lane*.py`` compare bytes on a real server.

What is not in the lane, on purpose: request bodies, upgrades, rate limits
(they await Redis), pools, canary and discovery (their selectors choose),
the access log and dry-run (the stack is not the plain one then).
``server.lane: false`` turns the lane off.

A client that leaves while the upstream works (``ResponseCycle.left`` calls
``_Exchange.gone``): before the head, the upstream connection is closed at once
and the request goes to the ASGI path with ``ClientGone`` as the attempt's
result, which records ``CLIENT_GONE`` and releases as the ASGI path does when
the proxy's own wait is cancelled the same way (``ResponseCycle.stop``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import httpx

from ballast_asgi.core.forwarded import client_ip
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Receive, Scope, Send
from ballast_asgi.middleware.concurrency import finish
from ballast_asgi.middleware.pipeline import Entered, Pipeline
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.body import ClientGone
from ballast_asgi.proxy.laned import Checked, LanedProxy


class Lane:
    """Serves the common proxied request of one stack with callbacks (see the module)."""

    __slots__ = ("_breaker", "_clock", "_held", "_retry", "admission", "pipeline", "proxy")

    def __init__(self, pipeline: Pipeline, proxy: ProxyApp) -> None:
        self.pipeline = pipeline
        self.proxy = LanedProxy(proxy)
        #: The stack's admission stage (a head it read at the wire is this stack's).
        self.admission = pipeline.stages.admission.stage
        stages = pipeline.stages
        self._breaker = stages.breaker.stage
        self._retry = None if stages.retry is None else stages.retry.stage
        self._held = stages.capacity.stage.capacity
        self._clock = stages.concurrency.stage.clock

    def start(self, scope: Scope, cycle: Any) -> bool:
        """Serve the request of ``scope`` on ``cycle`` (True: it is the lane's now, whatever
        happens next); False: not begun, nothing counted (the server starts the ASGI task)."""
        if not self.proxy.ready() or cycle.waiting_for_100_continue:
            return False  # (``Expect: 100-continue``: the proxy's ``receive`` answers it)
        pipeline = self.pipeline
        entered = pipeline.enter(scope)
        if entered.__class__ is not tuple:
            cycle.start(_Run(entered))  # type: ignore[arg-type]  # answered or waiting: ASGI
            return True
        try:
            self._first(entered, cycle)
        except Exception as exc:  # a bug must not leak the permit: ``run_asgi``'s 500
            ctx = entered[0]
            ticket, ctx.ticket = ctx.ticket, None
            self.failed(entered, cycle, ticket, None, exc)
        return True

    def failed(
        self, entered: Entered, cycle: Any, ticket: Any, client: str | None, exc: Exception
    ) -> None:
        """The lane raised while it held the request: what ``run_asgi`` and the stages'
        ``finally`` do for an app that raised (the ticket settled as recorded, or neutral;
        uvicorn's 500 or the close; the permit released, the slot left)."""
        ctx = entered[0]
        cycle.on_gone = None
        if ticket is not None and not ticket.settled:
            self._breaker.settle(ticket, ctx.outcome or _GATEWAY_ERROR, client)
        cycle.fail(exc)
        self.finished(entered)

    def finished(self, entered: Entered) -> None:
        """The request is over: its permit released with the attempt's signal, its slot left."""
        ctx, _, permit = entered
        finish(permit, ctx, self._clock())
        self._held.leave()

    def _first(self, entered: Entered, cycle: Any) -> None:
        """The first attempt: the retry stage's ``begin``, the breaker's ticket, the upstream
        request; or the ASGI path from the permit (what it takes is on the context)."""
        pipeline = self.pipeline
        ctx, child, _ = entered
        now = self._clock()
        route = ctx.route
        breaker = self._breaker.breakers.get(None if route is None else route.name)
        client = client_ip(child)
        ticket = breaker.acquire(now, client)
        if ticket is None:  # the breaker stage's shed (it asks again): the ASGI path's
            cycle.start(_Run(partial(pipeline.permitted, entered, None)))
            return
        ctx.ticket = ticket
        retry = self._retry
        retrying = retry is not None and retry.begin(child, ctx)
        exchange = _Exchange(self, cycle, entered, retrying, ticket, client)
        cycle.on_gone = exchange.gone  # before: an answer told at once clears it
        begun = self.proxy.begin(child, ctx, exchange.told)
        if begun is None:  # the proxy's own way (connect, 504, ...) with this ticket
            cycle.on_gone = None
            cycle.start(_Run(partial(pipeline.permitted, entered, retrying)))
            return
        ctx.ticket = None  # the exchange holds it (and hands it on with the request, if so)
        exchange.response, exchange.upstream, exchange.started = begun


class _Exchange:
    """One request in the lane, from its upstream request to its end."""

    __slots__ = (
        "checked", "client", "cycle", "entered", "head_at", "lane", "response", "retrying",
        "started", "ticket", "upstream",
    )  # fmt: skip

    def __init__(
        self, lane: Lane, cycle: Any, entered: Entered, retrying: bool, ticket: Any, client: Any
    ) -> None:
        self.lane = lane
        self.cycle = cycle
        self.entered = entered
        self.retrying = retrying
        self.ticket = ticket
        self.client = client
        self.response: Any = None
        self.upstream: Any = None
        self.started = self.head_at = 0.0
        self.checked: Checked | None = None

    def told(self, error: httpx.TransportError | None) -> None:
        """The upstream's answer: its head is in, or more of its body (``error`` None), or
        the exchange failed (before its head, or while its body was awaited)."""
        lane = self.lane
        ctx, scope, _ = self.entered
        cycle = self.cycle
        cycle.on_gone = None
        response = self.response
        try:
            if error is not None:  # after the head: the ASGI path relays it, then fails
                self._hand_on(None if response.final else error)
                return
            checked = self.checked
            if checked is None:  # the head: the time to it is the attempt's RTT
                self.head_at = lane.proxy.app.clock()
                checked = self.checked = lane.proxy.check(scope, response)
                if checked is None:
                    self._hand_on(None)
                    return
            if not response.complete:
                response.notify = self.told  # the rest of a small body: told again
                cycle.on_gone = self.gone
                return
            answer = None
            if not cycle.flow.write_paused:  # else the ASGI path's ``send`` waits for it
                exchange = (response, self.upstream, self.started, self.head_at)
                answer = lane.proxy.answer(scope, ctx, exchange, checked, self.retrying)
            if answer is None:
                self._hand_on(None)
                return
            status, headers, body = answer
            lane._breaker.at_head(self.ticket, ctx, status, self.client, scope["path"])
            if checked[3] or not body:  # a Location rewritten to the client's Host, or
                cycle.deliver_whole(status, headers, body)  # no body: uvicorn's checks
            else:  # the upstream's head as llhttp and ``response_head`` checked it
                cycle.deliver_relayed(status, headers, body)
        except Exception as exc:  # what ``run_asgi`` does for an app that raised
            lane.failed(self.entered, cycle, self.ticket, self.client, exc)
            return
        lane.finished(self.entered)

    def gone(self) -> None:
        """The client left before its answer (``ResponseCycle.left``). Before the head, the
        upstream exchange ends now (its connection closed: no more upstream work for an
        answer nobody reads) and the ASGI path records the attempt as the proxy does
        (``ClientGone``: ``CLIENT_GONE``, neutral), then releases what the request holds.
        With the head in (a small body still coming), the ASGI path takes the response as
        it is and finds the client gone at its first write, as it would have."""
        response = self.response
        response.notify = None
        if self.checked is None:
            response.abort()
            self._hand_on(ClientGone())
        else:
            self._hand_on(None)

    def _hand_on(self, error: Exception | None) -> None:
        """The ASGI path goes on from this attempt's result (``ctx.prefetched``): the
        response (its head is in), or the error before it."""
        ctx = self.entered[0]
        result = self.cycle.protocol.loop.create_future()
        if error is None:
            result.set_result(self.response)
        else:
            result.set_exception(error)
        ctx.ticket = self.ticket
        ctx.prefetched = (self.upstream, result, self.started)
        run = partial(self.lane.pipeline.permitted, self.entered, self.retrying)
        self.cycle.start(_Run(run))


_GATEWAY_ERROR = AttemptOutcome.GATEWAY_ERROR


class _Run:
    """An ASGI app running ``run(receive, send)`` for the cycle's request (its scope is the
    one the stages built, already bound)."""

    __slots__ = ("run",)

    def __init__(self, run: Callable[[Receive, Send], Awaitable[None]]) -> None:
        self.run = run

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        return self.run(receive, send)


__all__ = ["Lane"]
