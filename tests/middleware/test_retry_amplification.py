"""Integration: an upstream that fails every request cannot amplify load past the budget.

The stack is RetryMiddleware over BreakerMiddleware over the real ProxyApp over
``httpx.MockTransport``
(every call raises ``httpx.ConnectError``, as for a killed upstream). Open-loop
arrivals at a fixed rate on a fake clock; each request runs to completion before
the next arrives (no waiting: backoff sleeps are recorded, not slept).
"""

from __future__ import annotations

import math
import random

import httpx
import pytest

from ballast_asgi.config import BreakerConfig, RetryConfig
from ballast_asgi.core.breaker import Breaker, BreakerState
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.retry_budget import RetryBudget
from ballast_asgi.core.types import Message
from ballast_asgi.middleware.breaker import BreakerMiddleware
from ballast_asgi.middleware.context import RequestContext, with_context
from ballast_asgi.middleware.responses import ShedResponder
from ballast_asgi.middleware.retry import RetryMiddleware
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.telemetry.metrics import null_metrics

RATE_PER_S = 200
DEADLINE_S = 1.0


class Rig:
    """Breaker + budget + proxy, a scripted upstream and a fake clock."""

    def __init__(self, breaker: Breaker, retry: RetryConfig) -> None:
        self.now = 0.0
        self.healthy = False
        self.upstream_calls = 0
        self.metrics = null_metrics()
        self.breaker = breaker
        self.budget = RetryBudget.from_config(retry)
        self.proxy = ProxyApp(
            "http://u.test", transport=httpx.MockTransport(self._upstream), clock=self.clock
        )
        stage = BreakerMiddleware(
            self.proxy,
            breaker=breaker,
            responder=ShedResponder(self.metrics, rng=random.Random(0)),
            metrics=self.metrics,
            clock=self.clock,
        )
        self.app = RetryMiddleware(
            stage,
            budget=self.budget,
            metrics=self.metrics,
            config=retry,
            gate=stage.admits,
            clock=self.clock,
            rng=random.Random(7),
            sleep=self._sleep,
        )
        self.statuses: dict[int, int] = {}

    def clock(self) -> float:
        return self.now

    async def _sleep(self, seconds: float) -> None:
        assert 0 <= seconds <= 0.2

    def _upstream(self, request: httpx.Request) -> httpx.Response:
        self.upstream_calls += 1
        if not self.healthy:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(200, content=b"ok")

    async def request(self) -> int:
        ctx = RequestContext(arrival=self.now, deadline=self.now + DEADLINE_S, priority=Priority(1))
        scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "query_string": b""}
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)

        await self.app(with_context(scope, ctx), receive, send)
        status = int(sent[0]["status"])
        self.statuses[status] = self.statuses.get(status, 0) + 1
        return status

    async def run(self, duration_s: float) -> int:
        """Requests at RATE_PER_S for duration_s; returns how many were sent."""
        start = self.now
        n = int(duration_s * RATE_PER_S)
        for i in range(n):
            self.now = start + i / RATE_PER_S
            await self.request()
        self.now = start + duration_s
        return n


def floor_allowance(budget: RetryBudget, duration_s: float) -> float:
    """The most the floor can add over a run (see retry_budget's docstring)."""
    bucket_s = budget.window_s / 10
    return budget.floor * (math.floor(duration_s / (budget.window_s - bucket_s)) + 1)


@pytest.mark.anyio
@pytest.mark.parametrize("min_retries_per_s", [0.0, 1.0])
async def test_budget_caps_amplification_when_everything_fails(min_retries_per_s: float) -> None:
    """Breaker held closed: attempts / originals <= 1 + ratio, plus the floor's exact allowance."""
    retry = RetryConfig(min_retries_per_s=min_retries_per_s)
    rig = Rig(Breaker(enabled=False), retry)
    duration_s = 60.0
    originals = await rig.run(duration_s)
    await rig.proxy.aclose()
    amplification = rig.upstream_calls / originals
    bound = 1.0 + retry.budget_ratio + floor_allowance(rig.budget, duration_s) / originals
    assert rig.statuses == {502: originals}
    assert amplification <= bound
    if min_retries_per_s == 0.0:
        assert amplification <= 1.1
    # Every failure wanted a retry, so the budget is spent, not idle.
    assert amplification >= 1.09
    denied = rig.metrics.registry.get_sample_value("ballast_retries_total", {"result": "denied"})
    assert denied is not None and denied > originals * 0.8


@pytest.mark.anyio
async def test_breaker_opens_sheds_probes_and_closes_when_upstream_returns() -> None:
    """Default config: the breaker opens, sheds fast, probes one at a time, closes on recovery."""
    rig = Rig(Breaker.from_config(BreakerConfig()), RetryConfig())
    sent_failing = await rig.run(60.0)
    calls_failing = rig.upstream_calls
    assert rig.breaker.transitions["open"] >= 3  # the first trip and failed probes
    assert rig.breaker.state(rig.now) is not BreakerState.CLOSED
    # Attempts per request sent: far below 1.1 because open sheds without an attempt.
    assert calls_failing / sent_failing <= 1.1
    # Before the first trip at most 10 attempts (consecutive_failures); after it only probes,
    # one per open period (5 s, 10 s, 20 s, 40 s ...), never retried.
    probes = rig.breaker.transitions["half_open"]
    assert calls_failing <= 10 + probes
    assert rig.statuses[503] >= sent_failing - calls_failing
    rig.healthy = True
    sent_healthy = await rig.run(60.0)
    await rig.proxy.aclose()
    assert rig.breaker.state(rig.now) is BreakerState.CLOSED
    served_after = rig.upstream_calls - calls_failing
    # The open period in force when the upstream returned was at most 40 s long.
    assert served_after >= sent_healthy - 40 * RATE_PER_S
