"""Test fakes shared by the suite: a controllable clock, a recording limit, tiny upstreams.

Fakes, not mocks: each is a small real implementation of the seam it stands in for.
"""

from __future__ import annotations

from ballast_asgi.core.limit import FixedLimit, Sample
from ballast_asgi.core.types import Message, Receive, Scope, Send
from ballast_asgi.middleware.context import find_context


class FakeClock:
    """Monotonic seconds that only move when told to."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds


class RecordingLimit(FixedLimit):
    """A fixed limit remembering every sample it was given."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.samples: list[Sample] = []

    def on_sample(self, sample: Sample, now: float) -> int:
        self.samples.append(sample)
        return self.limit


class StatusUpstream:
    """An in-process upstream app: answers ``status`` with ``body``, recording the outcome.

    It records the attempt's outcome on the request context before the head, as
    the proxy does, and counts its calls.
    """

    def __init__(self, status: int = 200, body: bytes = b"ok") -> None:
        self.status = status
        self.body = body
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        ctx = find_context(scope)
        if ctx is not None:
            ctx.record_status(self.status)
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": self.body})


def request_messages(body: bytes = b"", chunk: int = 0) -> list[Message]:
    """The ``http.request`` messages carrying ``body`` (in ``chunk``-sized pieces if > 0)."""
    if chunk <= 0 or len(body) <= chunk:
        return [{"type": "http.request", "body": body, "more_body": False}]
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    return [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1}
        for i, p in enumerate(pieces)
    ]
