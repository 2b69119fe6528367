"""``BallastTransport``: an httpx transport that carries the deadline and tier downstream.

``httpx.AsyncClient(transport=BallastTransport())`` wraps
``httpx.AsyncHTTPTransport()`` (or the transport given). For each call:

1. **Plan.** The budget comes from, in order: an ``X-Deadline-Ms`` the caller
   set on the request (forwarded unchanged on the first attempt); the request
   ballast admitted that this task serves (``current_context()``: its
   deadline minus the time already spent); ``ClientConfig.default_deadline_ms``;
   else none. The tier likewise: the caller's ``X-Priority``, the admitted
   request's tier (forwarded as ``X-Priority: critical|standard|bulk``),
   ``default_priority``, else none is sent.
2. **Refuse before sending** (the original raises, a retry returns the last
   answer instead): less budget than ``min_budget_ms`` or than the host's
   recent latency -> ``DeadlineExceeded`` (when the budget was the admitted
   request's, its outcome is recorded as ``DEADLINE``: the in-app breaker
   does not count the handler's error answer as the app failing; so is a
   failed answer that arrives with the budget spent, e.g. a downstream's 504
   for a request that expired in its queue); the host asked to back off
   (``Retry-After`` after a shed of this tier or a more important one) or the
   adaptive throttle refuses -> ``Throttled``.
3. **Send** with ``X-Deadline-Ms`` = whole milliseconds left, every httpx
   timeout cut to the budget, and the whole attempt bounded by it, the
   response body included (``DeadlineExceeded(sent=True)`` when it runs out).
4. **Judge and maybe retry** (``policy``): a shed is returned, never retried,
   and backs the host off; a 502/503/504 without ``X-Ballast-Reason`` or a
   connect error is retried when the method is idempotent, the body
   replayable, attempts are left, the deadline holds the jittered backoff plus
   ``min_budget_ms``, and the host's retry budget grants it.

Counters are plain integers in the per-host state; the Prometheus collector
(``client.metrics``) reads them at scrape time, so a call pays no metric cost.
Steps 1 and 2 (the plan, the refusal) are ``client/plan.py``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx

from ballast_asgi.client.core import live
from ballast_asgi.client.core.config import ClientConfig
from ballast_asgi.client.core.hosts import HostState, HostTable, LabelCounts
from ballast_asgi.client.core.policy import (
    Verdict,
    backoff_s,
    classify_status,
    may_retry,
    retry_after_s,
)
from ballast_asgi.client.errors import DeadlineExceeded
from ballast_asgi.client.headers import cut_timeouts, host_key
from ballast_asgi.client.plan import DEADLINE_HEADER, CallPlan, make_plan, refuse, spent
from ballast_asgi.client.stream import BoundedStream
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Clock
from ballast_asgi.middleware.context import RequestContext, current_context

Sleep = Callable[[float], Awaitable[None]]
ContextSource = Callable[[], RequestContext | None]

_REASON = "x-ballast-reason"


class BallastTransport(httpx.AsyncBaseTransport):
    """Deadline and tier propagation, adaptive throttling and budgeted retries per host."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        config: ClientConfig | None = None,
        registry: Any = None,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        sleep: Sleep | None = None,
        context: ContextSource = current_context,
    ) -> None:
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()
        self.config = config if config is not None else ClientConfig()
        self.hosts = HostTable(self.config)
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self._sleep: Sleep = sleep if sleep is not None else anyio.sleep
        self._context = context
        live.register(self)
        if registry is not None:
            from ballast_asgi.client.metrics import ClientCollector

            registry.register(ClientCollector(lambda: [self]))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` under its budget; retry it within the host's budget."""
        key = host_key(request.url)
        host = self.hosts.get(key)
        now = self.clock()
        plan = make_plan(request, self._context(), self.config, now)
        replayable = isinstance(request.stream, httpx.ByteStream)
        last: httpx.Response | None = None
        error: Exception | None = None
        verdict = Verdict.OK
        attempt = 0
        while True:
            refusal = refuse(request, host, key, plan, self.clock(), self.config, self.rng)
            if refusal is not None:
                if attempt == 0:
                    raise spent(plan, refusal)
                break
            if attempt == 0:  # only a sent original earns retry budget
                host.budget.record_original(self.clock())
            if last is not None:
                await last.aclose()
            last, error, verdict = await self._attempt(request, host, plan, attempt)
            attempt += 1
            if not may_retry(request.method, verdict, replayable):
                break
            delay = self._retry(host, plan, attempt)
            if delay is None:
                break
            await self._backoff(delay, last)
        if error is not None:
            raise spent(plan, error)
        assert last is not None  # an attempt ran: it answered or raised
        self._late_failure(plan, verdict)
        return last

    def _late_failure(self, plan: CallPlan, verdict: Verdict) -> None:
        """A failed answer with the request's budget spent: record the deadline miss."""
        owner, deadline = plan.owner, plan.deadline
        if owner is None or deadline is None or verdict is Verdict.OK:
            return
        if deadline - self.clock() < self.config.min_budget_s:
            owner.record(AttemptOutcome.DEADLINE)

    async def _attempt(
        self, request: httpx.Request, host: HostState, plan: CallPlan, attempt: int
    ) -> tuple[httpx.Response | None, Exception | None, Verdict]:
        started = self.clock()
        left = None if plan.deadline is None else plan.deadline - started
        if left is not None:
            if not (plan.caller_deadline and attempt == 0):
                request.headers[DEADLINE_HEADER] = str(max(0, int(left * 1000.0)))
            request.extensions["timeout"] = cut_timeouts(request.extensions.get("timeout"), left)
        host.counts.sent += 1
        try:
            if left is None:
                response = await self._inner.handle_async_request(request)
            else:
                with anyio.fail_after(left):
                    response = await self._inner.handle_async_request(request)
        except TimeoutError:
            host.counts.failed += 1
            exc = DeadlineExceeded(
                f"{host_key(request.url)} did not answer within the call's {left or 0.0:.3f} s",
                request=request, host=host_key(request.url), remaining_ms=0.0, sent=True,
            )  # fmt: skip
            return None, exc, Verdict.FAILED
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            host.counts.failed += 1
            return None, exc, Verdict.CONNECT
        except httpx.TransportError as exc:
            host.counts.failed += 1
            return None, exc, Verdict.FAILED
        if plan.deadline is not None and isinstance(response.stream, httpx.AsyncByteStream):
            response.stream = BoundedStream(
                response.stream, deadline=plan.deadline, clock=self.clock, request=request,
                host=host_key(request.url),
            )  # fmt: skip
        return response, None, self._judge(response, host, plan, self.clock() - started)

    def _judge(
        self, response: httpx.Response, host: HostState, plan: CallPlan, rtt_s: float
    ) -> Verdict:
        reason = response.headers.get(_REASON)
        verdict = classify_status(response.status_code, reason is not None)
        now = self.clock()
        if verdict is Verdict.OK:
            host.throttle.record_accept(now)
            host.note_latency(rtt_s)
        elif verdict is Verdict.SHED:
            host.counts.shed += 1
            raw = response.headers.get("retry-after")
            wait = retry_after_s(raw, self.config.max_retry_after_s)
            host.note_shed(now, plan.tier, wait)
        else:
            host.counts.failed += 1
        return verdict

    def _retry(self, host: HostState, plan: CallPlan, attempt: int) -> float | None:
        """The backoff before retry ``attempt`` (budget taken), or None: no retry."""
        cfg = self.config
        if attempt >= cfg.max_attempts:
            return None
        delay = backoff_s(
            attempt, self.rng, cfg.backoff_base_ms / 1000.0, cfg.backoff_max_ms / 1000.0
        )
        now = self.clock()
        if plan.deadline is not None and now + delay + cfg.min_budget_s > plan.deadline:
            host.counts.retry_denied += 1
            return None
        if not host.budget.try_acquire_retry(now):
            host.counts.retry_denied += 1
            return None
        host.counts.retried += 1
        return delay

    async def _backoff(self, delay: float, held: httpx.Response | None) -> None:
        """Wait ``delay``; a cancelled wait closes the held failed response first."""
        try:
            await self._sleep(delay)
        except BaseException:
            if held is not None:
                with anyio.CancelScope(shield=True):
                    await held.aclose()
            raise

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self._inner.aclose()

    def totals(self) -> LabelCounts:
        """Every counter summed over the hosts' labels."""
        return self.hosts.totals()

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """JSON-safe state: totals, per-label counters and the held hosts' state."""
        return self.hosts.snapshot(self.clock() if now is None else now)
