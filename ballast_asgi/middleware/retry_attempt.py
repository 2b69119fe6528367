"""One retry attempt's ``send``: the decision at the response head (``RetryStage``'s helper).

``RetryStage.attempts`` (``middleware/retry.py``) makes one ``Attempt`` per
attempt and gives the inner app ``attempt.send``. Until the head, and after a
committed head, every message goes straight to the client's ``send``: a first
attempt's success (the common case) costs one call per message and nothing is
held. At the head, an outcome other than a first success asks the stage's
``plan``; a head it swallows gets a ``HeldResponse`` that holds the response,
bounded by the policy's ``hold_bytes`` and the byte budget, until the stage
flushes or drops it.

``RetryPolicy`` is one retry section (the gateway's or a route's), precomputed.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ballast_asgi.config import RetryConfig
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Message, Send
from ballast_asgi.middleware._asgi import HeldResponse
from ballast_asgi.middleware.context import RequestContext

if TYPE_CHECKING:
    from ballast_asgi.middleware.retry import RetryStage

_SUCCESS = AttemptOutcome.SUCCESS


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """One retry section, precomputed."""

    max_attempts: int
    retry_statuses: frozenset[int]
    hold_bytes: int
    backoff_base_s: float
    backoff_max_s: float

    @classmethod
    def of(cls, cfg: RetryConfig) -> RetryPolicy:
        enabled = cfg.enabled and cfg.buffer_responses
        return cls(
            max_attempts=cfg.max_attempts if enabled else 1,
            retry_statuses=frozenset(cfg.retry_statuses),
            hold_bytes=cfg.max_buffer_bytes,
            backoff_base_s=cfg.backoff_base_ms / 1000.0,
            backoff_max_s=cfg.backoff_max_ms / 1000.0,
        )


class Attempt:
    """One attempt: passes its response on, or holds it when the stage swallows its head.

    ``status``: the response head's status once one was sent; ``held``: the
    holding response when the head was swallowed (None: passed through);
    ``delay_s``: the backoff the stage planned before the next attempt;
    ``granted_at``: when the budget granted that retry (None: none granted).
    """

    __slots__ = (
        "_send", "_stage", "ctx", "delay_s", "granted_at", "held", "idempotent", "policy",
        "status",
    )  # fmt: skip

    def __init__(
        self,
        stage: RetryStage,
        ctx: RequestContext,
        send: Send,
        idempotent: bool,
        policy: RetryPolicy,
    ) -> None:
        self._stage = stage
        self._send = send
        self.ctx = ctx
        self.idempotent = idempotent
        self.policy = policy
        self.delay_s = 0.0
        self.granted_at: float | None = None
        self.status: int | None = None
        self.held: HeldResponse | None = None

    @property
    def passed_on(self) -> bool:
        """A response head reached the client: nothing may replace this attempt."""
        return self.status is not None and (self.held is None or self.held.committed)

    @property
    def kept(self) -> bool:
        """Nothing is held: the response (if any) went to the client."""
        return self.held is None or self.held.committed

    def send(self, message: Message) -> Awaitable[None]:
        """Decide at the head; every message goes to the client or to the held response."""
        if self.held is not None:
            return self.held.send(message)
        if self.status is None and message["type"] == "http.response.start":
            self.status = int(message["status"])
            ctx = self.ctx
            if ctx.outcome is not _SUCCESS or ctx.attempt:  # a first success commits at once
                return self._head(message, self.status)
        return self._send(message)

    def _head(self, message: Message, status: int) -> Awaitable[None]:
        ctx = self.ctx
        if ctx.outcome is _SUCCESS:  # not retryable: commit; a retry's success is counted
            self._stage.count_head(ctx)
            return self._send(message)
        planned = self._stage.plan(ctx, status, self.idempotent, self.policy)
        if planned is None:
            return self._send(message)
        self.delay_s, self.granted_at = planned
        self.held = HeldResponse(
            self._send, hold=True, limit_bytes=self.policy.hold_bytes,
            on_bytes=self._stage.hold_bytes,
        )  # fmt: skip
        return self.held.send(message)

    def retry_after_raise(self) -> bool:
        """An attempt raised: retry it if nothing was sent and its outcome allows."""
        if self.status is not None:
            return not self.kept  # planned at its head
        planned = self._stage.plan(self.ctx, None, self.idempotent, self.policy)
        if planned is None:
            return False
        self.delay_s, self.granted_at = planned
        return True

    async def flush(self) -> None:
        """Send the held response after all (the next attempt will not run)."""
        if self.held is not None:
            await self.held.flush()

    def drop(self) -> None:
        """Give back the bytes the held response counted (it is dropped)."""
        if self.held is not None:
            self.held.drop_bytes()
