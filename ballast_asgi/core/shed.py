"""A shed decision: the one value every shed point produces.

Each stage decides from numbers (a limit, a queue, a breaker, a bucket) and
gets either ``None`` (go on) or a ``Shed``. One helper acts on it
(``ShedResponder.act`` in ``middleware/responses.py``): enforcing, it counts it
in ``ballast_shed_total`` and sends the shed response; in dry-run it counts it
in ``ballast_dry_run_shed_total``, marks the request (``ctx.would_shed``) and
lets it continue. So a stage reads *decide -> act -> continue or return* and
has no dry-run branch of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.priority import Priority

#: Raw response headers (name, value), lower-case names.
ShedHeaders = tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True, slots=True)
class Shed:
    """One request refused: why, its tier, when to come back, and extra headers."""

    #: The ``reason`` label and the ``X-Ballast-Reason`` header.
    reason: ShedReason
    #: The ``priority`` label.
    priority: Priority
    #: Seconds the client should wait (``Retry-After``, rounded up, >= 1); None:
    #: the responder's drain estimate with jitter.
    retry_after_s: float | None = None
    #: Extra headers on the shed response (never added in dry-run: nothing is sent).
    headers: ShedHeaders = ()

    def __post_init__(self) -> None:
        if self.retry_after_s is not None and not self.retry_after_s >= 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s}")
