"""The exceptions a ``BallastTransport`` raises for a call it did not send (or cut short).

Both subclass httpx exceptions, so handlers callers already have keep working:

* ``DeadlineExceeded`` is an ``httpx.TimeoutException`` (so also a
  ``TransportError``, ``RequestError`` and ``HTTPError``): the call's budget
  was below ``min_budget_ms`` or the host's recent latency (``sent = False``,
  nothing reached the network), or it ran out while the call was in flight
  (``sent = True``).
* ``Throttled`` is an ``httpx.TransportError``: the call was refused locally,
  by the adaptive throttle (``reason = "throttled"``) or because the host
  asked to back off with ``Retry-After`` after a shed (``reason =
  "retry_after"``, ``retry_after_s`` says how much longer). Never sent.

Both carry ``host`` and subclass ``LocalRefusal``, for a handler that wants
exactly the calls this transport refused (``except LocalRefusal``).
"""

from __future__ import annotations

import httpx


class LocalRefusal(Exception):
    """Mixin of the transport's own refusals: ``host`` names the upstream."""

    host: str = ""


class DeadlineExceeded(LocalRefusal, httpx.TimeoutException):
    """The call had no budget left (``sent`` False) or ran out of it in flight."""

    def __init__(
        self, message: str, *, request: httpx.Request, host: str, remaining_ms: float, sent: bool
    ) -> None:
        super().__init__(message, request=request)
        self.host = host
        self.remaining_ms = remaining_ms
        self.sent = sent


class Throttled(LocalRefusal, httpx.TransportError):
    """The call was refused locally (adaptive throttle or Retry-After back-off)."""

    def __init__(
        self, message: str, *, request: httpx.Request, host: str, reason: str, retry_after_s: float
    ) -> None:
        super().__init__(message, request=request)
        self.host = host
        self.reason = reason
        self.retry_after_s = retry_after_s
