"""What a service answers when its outgoing call was refused: a shed, like ballast's own.

``app.add_exception_handler(LocalRefusal, refusal_handler)`` (Starlette or
FastAPI) turns a ``DeadlineExceeded`` or ``Throttled`` that a handler lets
propagate into the answer ballast's own admission gives for the same
situation: status 429, ``Retry-After`` (whole seconds, >= 1) and

* ``X-Ballast-Reason: deadline`` for ``DeadlineExceeded`` (the request can
  no longer make its deadline), or
* ``X-Ballast-Reason: early_drop`` for ``Throttled`` (dropped early because
  the next service asked to back off or refuses work: DAGOR's upstream
  early drop; ``Retry-After`` is the host's back-off).

So the callers upstream see a shed (never retried, breaker-neutral) rather
than a 5xx that their breakers count and their retries repeat.
"""

from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ballast_asgi.client.errors import DeadlineExceeded, LocalRefusal, Throttled
from ballast_asgi.core.outcome import ShedReason


def refusal_response(exc: LocalRefusal) -> Response:
    """The shed answer for a refused outgoing call."""
    reason = ShedReason.DEADLINE if isinstance(exc, DeadlineExceeded) else ShedReason.EARLY_DROP
    wait = exc.retry_after_s if isinstance(exc, Throttled) else 1.0
    headers = {"Retry-After": str(max(1, math.ceil(wait))), "X-Ballast-Reason": reason.value}
    body = {"error": "shed", "reason": reason.value, "message": str(exc)}
    return JSONResponse(body, status_code=429, headers=headers)


async def refusal_handler(request: Request, exc: Exception) -> Response:
    """A Starlette/FastAPI exception handler for ``LocalRefusal``."""
    if not isinstance(exc, LocalRefusal):
        raise exc
    return refusal_response(exc)
