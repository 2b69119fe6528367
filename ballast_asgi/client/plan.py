"""Before a call is sent: its plan (budget and tier) and the reasons to refuse it.

``make_plan`` fixes a call's budget and tier before its first attempt (steps 1
of ``transport.py``): the deadline from the caller's ``X-Deadline-Ms``, else
the admitted request this task serves (``current_context()``: its deadline
minus the time already spent), else ``ClientConfig.default_deadline_ms``; the
tier from the caller's ``X-Priority``, else the admitted request's (written to
the request), else ``default_priority``. ``refuse`` says why an attempt must
not be sent (step 2): too little budget (``DeadlineExceeded``), a host that
asked this tier to back off or an adaptive throttle that refuses
(``Throttled``). ``spent`` records a deadline miss on the admitted request
whose budget ran out. The attempts and retries are ``transport.py``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

from ballast_asgi.client.core.config import ClientConfig
from ballast_asgi.client.core.hosts import HostState
from ballast_asgi.client.errors import DeadlineExceeded, Throttled
from ballast_asgi.client.headers import lenient_priority, tier_value
from ballast_asgi.core.deadline import parse_budget_ms
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.middleware.context import RequestContext

DEADLINE_HEADER = "x-deadline-ms"
PRIORITY_HEADER = "x-priority"


@dataclass(slots=True)
class CallPlan:
    """One call's budget and tier, fixed before its first attempt."""

    deadline: float | None
    tier: Priority
    caller_deadline: bool
    #: The admitted request whose deadline this call spends (None: not its deadline).
    owner: RequestContext | None


def make_plan(
    request: httpx.Request, ctx: RequestContext | None, config: ClientConfig, now: float
) -> CallPlan:
    """The call's plan; sets ``X-Priority`` on ``request`` when the tier comes from below."""
    deadline, caller = _deadline(request, ctx, config, now)
    raw_tier = request.headers.get(PRIORITY_HEADER)
    if raw_tier is not None:
        tier = lenient_priority(raw_tier)
    elif ctx is not None:
        request.headers[PRIORITY_HEADER] = tier_value(ctx)
        tier = ctx.priority
    elif config.default_priority is not None:
        tier = config.default_priority
        request.headers[PRIORITY_HEADER] = tier.label
    else:
        tier = Priority.STANDARD
    owner = ctx if ctx is not None and ctx.deadline is not None and not caller else None
    return CallPlan(deadline, tier, caller, owner)


def _deadline(
    request: httpx.Request, ctx: RequestContext | None, config: ClientConfig, now: float
) -> tuple[float | None, bool]:
    raw = request.headers.get(DEADLINE_HEADER)
    if raw is not None:
        try:
            return now + parse_budget_ms(raw.encode("latin-1")) / 1000.0, True
        except (HeaderError, UnicodeEncodeError):
            pass  # forwarded as the caller wrote it; the budget comes from below
    if ctx is not None and ctx.deadline is not None:
        return now + (ctx.deadline - ctx.clock()), raw is not None
    if config.default_deadline_ms is not None:
        return now + config.default_deadline_ms / 1000.0, raw is not None
    return None, raw is not None


def refuse(
    request: httpx.Request,
    host: HostState,
    key: str,
    plan: CallPlan,
    now: float,
    config: ClientConfig,
    rng: random.Random,
) -> Exception | None:
    """Why this attempt must not be sent (counted on ``host``), or None."""
    if plan.deadline is not None:
        left = plan.deadline - now
        if left < config.min_budget_s or (
            config.latency_guard and host.latency_s is not None and left < host.latency_s
        ):
            host.counts.no_budget += 1
            return DeadlineExceeded(
                f"not sent to {key}: {max(0.0, left) * 1000:.1f} ms of budget left "
                f"(floor {config.min_budget_ms:g} ms, recent latency "
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
    if not host.throttle.admit(now, rng):
        host.counts.throttled += 1
        p = host.throttle.reject_probability(now)
        return Throttled(
            f"not sent to {key}: adaptive throttle (reject probability {p:.2f})",
            request=request, host=key, reason="throttled", retry_after_s=0.0,
        )  # fmt: skip
    return None


def spent(plan: CallPlan, exc: Exception) -> Exception:
    """``exc``; a DeadlineExceeded on the admitted request's own deadline is recorded on it.

    The request's outcome becomes ``DEADLINE`` (the first record wins): its
    deadline ran out, which the limiter counts as congestion and the breaker
    as neutral, whatever status the handler answers with afterwards.
    """
    if plan.owner is not None and isinstance(exc, DeadlineExceeded):
        plan.owner.record(AttemptOutcome.DEADLINE)
    return exc
