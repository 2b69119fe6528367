"""Small httpx-facing helpers of the transport: host keys, tier values, timeouts.

``tier_value`` forwards the tier of the admitted request as the caller spelt
it (``0``, ``critical``, ``Critical``...) when the incoming ``X-Priority``
named that tier, else as its label (``critical|standard|bulk``): a
downstream sees the caller's own value whenever ballast kept it.
"""

from __future__ import annotations

from typing import Any

import httpx

from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.priority import Priority, parse_priority
from ballast_asgi.middleware.context import RequestContext

_TIMEOUT_KEYS = ("connect", "read", "write", "pool")


def host_key(url: httpx.URL) -> str:
    """``scheme://host:port`` of ``url`` (the port made explicit)."""
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"{url.scheme}://{url.host}:{port}"


def lenient_priority(raw: str) -> Priority:
    """The caller's tier for bookkeeping (an unknown value counts as standard)."""
    try:
        return parse_priority(raw.encode("latin-1"), Priority.STANDARD)
    except (HeaderError, UnicodeEncodeError):
        return Priority.STANDARD


def tier_value(ctx: RequestContext) -> str:
    """The ``X-Priority`` to forward for the admitted request ``ctx``."""
    raw = ctx.head.priority
    if raw is not None:
        try:
            if parse_priority(raw, ctx.priority) is ctx.priority:
                return raw.strip().decode("latin-1")
        except HeaderError:
            pass
    return ctx.priority.label


def cut_timeouts(timeout: Any, left: float) -> dict[str, float]:
    """httpx per-phase timeouts, each cut to ``left`` seconds (at least 1 ms)."""
    bound = max(left, 0.001)
    old = timeout if isinstance(timeout, dict) else {}
    out = {}
    for name in _TIMEOUT_KEYS:
        value = old.get(name)
        out[name] = bound if value is None else min(float(value), bound)
    return out
