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
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
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
from ballast_asgi.client.errors import DeadlineExceeded, Throttled
from ballast_asgi.client.headers import cut_timeouts, host_key, lenient_priority, tier_value
from ballast_asgi.client.stream import BoundedStream
from ballast_asgi.core.deadline import parse_budget_ms
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.types import Clock
from ballast_asgi.middleware.context import RequestContext, current_context

Sleep = Callable[[float], Awaitable[None]]
ContextSource = Callable[[], RequestContext | None]

_DEADLINE = "x-deadline-ms"
_PRIORITY = "x-priority"
_REASON = "x-ballast-reason"


@dataclass(slots=True)
class _Plan:
    """One call's budget and tier, fixed before its first attempt."""

    deadline: float | None
    tier: Priority
    caller_deadline: bool
    #: The admitted request whose deadline this call spends (None: not its deadline).
    owner: RequestContext | None


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
        plan = self._plan(request, now)
        replayable = isinstance(request.stream, httpx.ByteStream)
        last: httpx.Response | None = None
        error: Exception | None = None
        verdict = Verdict.OK
        attempt = 0
        while True:
            refusal = self._refusal(request, host, key, plan, self.clock())
            if refusal is not None:
                if attempt == 0:
                    raise _spent(plan, refusal)
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
            raise _spent(plan, error)
        assert last is not None  # an attempt ran: it answered or raised
        self._late_failure(plan, verdict)
        return last

    def _late_failure(self, plan: _Plan, verdict: Verdict) -> None:
        """A failed answer with the request's budget spent: record the deadline miss."""
        owner, deadline = plan.owner, plan.deadline
        if owner is None or deadline is None or verdict is Verdict.OK:
            return
        if deadline - self.clock() < self.config.min_budget_s:
            owner.record(AttemptOutcome.DEADLINE)

    def _plan(self, request: httpx.Request, now: float) -> _Plan:
        ctx = self._context()
        deadline, caller = self._deadline(request, ctx, now)
        raw_tier = request.headers.get(_PRIORITY)
        if raw_tier is not None:
            tier = lenient_priority(raw_tier)
        elif ctx is not None:
            request.headers[_PRIORITY] = tier_value(ctx)
            tier = ctx.priority
        elif self.config.default_priority is not None:
            tier = self.config.default_priority
            request.headers[_PRIORITY] = tier.label
        else:
            tier = Priority.STANDARD
        owner = ctx if ctx is not None and ctx.deadline is not None and not caller else None
        return _Plan(deadline, tier, caller, owner)

    def _deadline(
        self, request: httpx.Request, ctx: RequestContext | None, now: float
    ) -> tuple[float | None, bool]:
        raw = request.headers.get(_DEADLINE)
        if raw is not None:
            try:
                return now + parse_budget_ms(raw.encode("latin-1")) / 1000.0, True
            except (HeaderError, UnicodeEncodeError):
                pass  # forwarded as the caller wrote it; the budget comes from below
        if ctx is not None and ctx.deadline is not None:
            return now + (ctx.deadline - ctx.clock()), raw is not None
        if self.config.default_deadline_ms is not None:
            return now + self.config.default_deadline_ms / 1000.0, raw is not None
        return None, raw is not None

    def _refusal(
        self, request: httpx.Request, host: HostState, key: str, plan: _Plan, now: float
    ) -> Exception | None:
        """Why this attempt must not be sent, or None."""
        if plan.deadline is not None:
            left = plan.deadline - now
            if left < self.config.min_budget_s or (
                self.config.latency_guard and host.latency_s is not None and left < host.latency_s
            ):
                host.counts.no_budget += 1
                return DeadlineExceeded(
                    f"not sent to {key}: {max(0.0, left) * 1000:.1f} ms of budget left "
                    f"(floor {self.config.min_budget_ms:g} ms, recent latency "
                    f"{(host.latency_s or 0.0) * 1000:.1f} ms)",
                    request=request, host=key, remaining_ms=left * 1000.0, sent=False,
                )  # fmt: skip
        wait = host.blocked_s(now, plan.tier)
        if wait > 0.0:
            host.counts.backed_off += 1
            return Throttled(
                f"not sent to {key}: it shed a {plan.tier.label} call; Retry-After {wait:.1f} s",
                request=request, host=key, reason="retry_after", retry_after_s=wait,
            )  # fmt: skip
        if not host.throttle.admit(now, self.rng):
            host.counts.throttled += 1
            p = host.throttle.reject_probability(now)
            return Throttled(
                f"not sent to {key}: adaptive throttle (reject probability {p:.2f})",
                request=request, host=key, reason="throttled", retry_after_s=0.0,
            )  # fmt: skip
        return None

    async def _attempt(
        self, request: httpx.Request, host: HostState, plan: _Plan, attempt: int
    ) -> tuple[httpx.Response | None, Exception | None, Verdict]:
        started = self.clock()
        left = None if plan.deadline is None else plan.deadline - started
        if left is not None:
            if not (plan.caller_deadline and attempt == 0):
                request.headers[_DEADLINE] = str(max(0, int(left * 1000.0)))
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
        self, response: httpx.Response, host: HostState, plan: _Plan, rtt_s: float
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

    def _retry(self, host: HostState, plan: _Plan, attempt: int) -> float | None:
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


def _spent(plan: _Plan, exc: Exception) -> Exception:
    """``exc``; a DeadlineExceeded on the admitted request's own deadline is recorded on it.

    The request's outcome becomes ``DEADLINE`` (the first record wins): its
    deadline ran out, which the limiter counts as congestion and the breaker
    as neutral, whatever status the handler answers with afterwards.
    """
    if plan.owner is not None and isinstance(exc, DeadlineExceeded):
        plan.owner.record(AttemptOutcome.DEADLINE)
    return exc
