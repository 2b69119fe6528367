"""What a call's answer means, whether to retry it, and how long to wait (pure).

Verdicts (``classify_status``; transport errors map in the adapter):

==============  ==========================================  ========  ==========
verdict         when                                         accepted  retried
==============  ==========================================  ========  ==========
``OK``          any other status (2xx-4xx, 500, 501, ...)    yes       no
``SHED``        ``X-Ballast-Reason`` present (any status),   no        never: the
                or 429                                                 host backs
                                                                       off for
                                                                       Retry-After
``RETRYABLE``   502 / 503 / 504 without ``X-Ballast-Reason``  no        idempotent
``CONNECT``     connect error / connect timeout (not sent)   no        idempotent
``FAILED``      any other transport error, the deadline      no        no
==============  ==========================================  ========  ==========

"Accepted" feeds the adaptive throttle's ``accepts``. A retry also needs a
replayable body, attempts left, the host's retry budget, the adaptive
throttle, and room before the deadline for the backoff plus ``min_budget``.

Backoff before retry ``n`` (1-based), full jitter (AWS architecture blog)::

    backoff(n) = uniform(0, min(backoff_max, backoff_base * 2 ** (n - 1)))

``Retry-After`` is delta-seconds (a decimal is accepted); an HTTP-date or
garbage reads as 1 s; the value is cut to ``[0, cap]``.
"""

from __future__ import annotations

import enum
import math
import random

#: RFC 9110 idempotent methods: the only ones a transport may repeat.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
RETRYABLE_STATUSES = frozenset({502, 503, 504})
#: ``Retry-After`` when the header is missing or unreadable.
DEFAULT_RETRY_AFTER_S = 1.0


class Verdict(enum.Enum):
    """How one attempt ended, as far as throttling and retrying care."""

    OK = "ok"
    SHED = "shed"
    RETRYABLE = "retryable"
    CONNECT = "connect_error"
    FAILED = "failed"

    @property
    def accepted(self) -> bool:
        """Whether the backend accepted the call (the throttle's ``accepts``)."""
        return self is Verdict.OK

    @property
    def retryable(self) -> bool:
        """Whether another attempt may replace this one (idempotent calls only)."""
        return self is Verdict.RETRYABLE or self is Verdict.CONNECT


def classify_status(status: int, ballast_reason: bool) -> Verdict:
    """The verdict of a response head (``ballast_reason``: ``X-Ballast-Reason`` present)."""
    if ballast_reason or status == 429:
        return Verdict.SHED
    if status in RETRYABLE_STATUSES:
        return Verdict.RETRYABLE
    return Verdict.OK


def may_retry(method: str, verdict: Verdict, replayable: bool) -> bool:
    """The retry decision table: an idempotent, replayable call after a retryable verdict."""
    return verdict.retryable and replayable and method.upper() in IDEMPOTENT_METHODS


def backoff_s(retry: int, rng: random.Random, base_s: float, max_s: float) -> float:
    """Full-jitter backoff before retry number ``retry`` (1-based), in seconds."""
    if retry < 1:
        raise ValueError(f"retry must be >= 1, got {retry}")
    ceiling = min(max_s, base_s * 2.0 ** min(retry - 1, 60))
    return rng.uniform(0.0, ceiling)


def retry_after_s(raw: str | None, cap_s: float) -> float:
    """Seconds a ``Retry-After`` value asks for, cut to ``[0, cap_s]``."""
    value = DEFAULT_RETRY_AFTER_S
    if raw is not None:
        try:
            parsed = float(raw.strip())
        except ValueError:
            parsed = DEFAULT_RETRY_AFTER_S
        if math.isfinite(parsed):
            value = parsed
    return min(max(0.0, value), cap_s)
