"""The one mapping from an upstream failure to an error kind, an outcome and a response.

Kinds (``ctx.upstream_error`` values and the ``kind`` label of
``ballast_upstream_errors``): ``timeout`` (the gateway's own upstream timeout:
504), ``deadline`` (the request's X-Deadline-Ms ran out: 504, says nothing
about the upstream), ``connect`` (502), ``protocol`` (reset, malformed or
truncated answer, or a response head ``headers.response_head`` refuses:
502). Small JSON bodies, never a stack trace.
"""

from __future__ import annotations

import httpx

from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Clock

#: Kind -> (status, JSON body).
ERROR_BODIES: dict[str, tuple[int, dict[str, object]]] = {
    "timeout": (504, {"error": "gateway_timeout", "message": "upstream did not answer in time"}),
    "deadline": (
        504,
        {"error": "gateway_timeout", "message": "the request's deadline passed (X-Deadline-Ms)"},
    ),
    "connect": (502, {"error": "bad_gateway", "message": "upstream connection failed"}),
    "protocol": (502, {"error": "bad_gateway", "message": "upstream protocol error"}),
}

#: Kind -> the attempt's outcome.
OUTCOMES = {
    "timeout": AttemptOutcome.TIMEOUT,
    "deadline": AttemptOutcome.DEADLINE,
    "connect": AttemptOutcome.CONNECT_ERROR,
    "protocol": AttemptOutcome.PROTOCOL_ERROR,
}

BAD_TARGET: dict[str, object] = {
    "error": "bad_request",
    "message": "the request target must be origin-form (/path?query); nothing was forwarded",
}


def kind_of(exc: BaseException) -> str:
    """The error kind of an httpx failure (or of the proxy's own head timeout)."""
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    return "protocol"


#: A timeout this close to the request's deadline was the deadline, not the upstream.
DEADLINE_SLACK_S = 0.002


def failure_kind(exc: BaseException, deadline: float | None, clock: Clock) -> str:
    """``kind_of``, but ``deadline`` when a timeout only enforced the request's own budget."""
    kind = kind_of(exc)
    if kind == "timeout" and deadline is not None and clock() >= deadline - DEADLINE_SLACK_S:
        return "deadline"
    return kind


MISMATCH: dict[str, object] = {
    "error": "bad_request",
    "message": "the request body is not the length its head declared",
    "header": "Content-Length",
}


def status_outcome(status: int) -> AttemptOutcome:
    """A response head's outcome: 5xx is a failure status, anything else a success."""
    return AttemptOutcome.STATUS_5XX if status >= 500 else AttemptOutcome.SUCCESS


def too_large(limit: int) -> dict[str, object]:
    """The 413 body."""
    return {"error": "payload_too_large", "max_body_bytes": limit}


__all__ = [
    *("BAD_TARGET", "ERROR_BODIES", "MISMATCH", "OUTCOMES", "failure_kind", "kind_of"),
    *("status_outcome", "too_large"),
]
