"""Deadline parsing and arithmetic (pure).

``X-Deadline-Ms`` carries the budget, in milliseconds, that remained when the
client sent the request (gRPC timeout semantics). On arrival it becomes an
absolute deadline on the gateway's monotonic clock::

    deadline = now + budget_ms / 1000

A budget <= 0 is already expired (dead on arrival). A value that is not a
finite number, or is larger than ``MAX_BUDGET_MS`` (one day), is malformed.
Upstream, the header carries ``remaining_ms(deadline, now)`` rounded down.
"""

from __future__ import annotations

import math

from ballast_asgi.core.errors import HeaderError

DEADLINE_HEADER = b"x-deadline-ms"
#: The largest budget accepted: one day.
MAX_BUDGET_MS = 86_400_000.0


def parse_budget_ms(raw: bytes) -> float:
    """Parse a raw header value into a budget in milliseconds (may be <= 0)."""
    try:
        value = float(raw.strip().decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise HeaderError("X-Deadline-Ms", "must be a number of milliseconds") from None
    if not math.isfinite(value):
        raise HeaderError("X-Deadline-Ms", "must be a finite number of milliseconds")
    if value > MAX_BUDGET_MS:
        raise HeaderError("X-Deadline-Ms", f"must be at most {MAX_BUDGET_MS:.0f} ms (one day)")
    return value


def absolute_deadline(
    raw: bytes | None, now: float, default_budget_ms: float | None
) -> float | None:
    """The absolute deadline (monotonic seconds) for a request, or None for none."""
    if raw is None:
        if default_budget_ms is None:
            return None
        return now + default_budget_ms / 1000.0
    return now + parse_budget_ms(raw) / 1000.0


def remaining_s(deadline: float | None, now: float) -> float | None:
    """Seconds left before ``deadline`` (negative when passed); None when unbounded."""
    if deadline is None:
        return None
    return deadline - now


def remaining_ms_header(deadline: float, now: float) -> bytes:
    """The header value to forward upstream: whole milliseconds left, floored at 0."""
    return str(max(0, int((deadline - now) * 1000.0))).encode("ascii")
