"""The stages as one Pipeline: the common path fused, every other path the middlewares' own."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ballast_asgi.config import build_config
from ballast_asgi.core.outcome import Outcome
from ballast_asgi.core.types import Receive, Scope, Send
from ballast_asgi.gateway.stack import Parts, build_parts, build_stack
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.body import BodyMiddleware, BodyStage
from ballast_asgi.middleware.capacity import CapacityMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware
from ballast_asgi.middleware.context import find_context
from ballast_asgi.middleware.pipeline import Pipeline
from ballast_asgi.middleware.queueing import QueueMiddleware
from ballast_asgi.middleware.retry import RetryMiddleware
from ballast_asgi.telemetry.metrics import Metrics
from tests.fakes import StatusUpstream

pytestmark = pytest.mark.anyio

FUSED = (AdmissionMiddleware, BodyMiddleware, CapacityMiddleware, QueueMiddleware,
         ConcurrencyMiddleware, RetryMiddleware)  # fmt: skip


def _stack(inner: Any, **config: Any) -> tuple[Any, Parts]:
    cfg = build_config({"upstream": "http://up.test", **config})
    parts = build_parts(cfg, Metrics())
    return build_stack(inner, parts, cfg, retries=True), parts


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw")


@pytest.fixture
def no_nested_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the fused stages' own ``__call__`` fail, so a test sees whether it was used."""

    async def refuse(self: object, scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError(f"{type(self).__name__}.__call__ ran")

    for cls in FUSED:
        monkeypatch.setattr(cls, "__call__", refuse)


def test_build_stack_composes_a_pipeline_unless_asked_for_the_chain() -> None:
    """Default: one Pipeline; ``pipeline=False``: the nested middlewares, admission outermost."""
    cfg = build_config({"upstream": "http://up.test"})
    parts = build_parts(cfg, Metrics())
    fused = build_stack(StatusUpstream(), parts, cfg, retries=True, pipeline=True)
    chain = build_stack(StatusUpstream(), parts, cfg, retries=True, pipeline=False)
    assert isinstance(fused, Pipeline) and isinstance(fused.app, AdmissionMiddleware)
    assert isinstance(chain, AdmissionMiddleware)


@pytest.mark.usefixtures("no_nested_calls")
async def test_a_plain_request_runs_no_stage_middleware_of_its_own() -> None:
    """A GET that nothing sheds: only the breaker's attempt wraps the inner app."""
    seen: dict[str, Any] = {}
    upstream = StatusUpstream()

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        ctx = find_context(scope)
        assert ctx is not None
        seen.update(permit=ctx.permit, held=parts.capacity.held if parts.capacity else None,
                    inflight=parts.limiter.inflight)  # fmt: skip
        await upstream(scope, receive, send)

    app, parts = _stack(inner)
    async with _client(app) as client:
        response = await client.get("/x")
    assert response.status_code == 200 and response.text == "ok"
    assert seen["permit"] is not None and seen["held"] == 1 and seen["inflight"] == 1
    assert parts.limiter.inflight == 0 and parts.capacity is not None
    assert parts.capacity.held == 0


@pytest.mark.usefixtures("no_nested_calls")
async def test_a_retried_attempt_runs_through_the_breaker_again() -> None:
    """A 502 then a 200: the retry loop calls the breaker stage once per attempt."""
    statuses = [502, 200]
    calls: list[int] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        status = statuses[len(calls)]
        calls.append(status)
        await StatusUpstream(status)(scope, receive, send)

    app, parts = _stack(inner, retry={"backoff_base_ms": 1, "backoff_max_ms": 1})
    async with _client(app) as client:
        response = await client.get("/x")
    assert response.status_code == 200 and calls == [502, 200]
    assert parts.limiter.inflight == 0


async def test_a_body_goes_through_the_body_stage_and_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A request with a body is buffered by the body stage, which runs the chain on."""
    used: list[str] = []
    original = BodyStage.run

    async def counted(self: BodyStage, app: Any, *args: Any) -> None:
        used.append("body")
        await original(self, app, *args)

    monkeypatch.setattr(BodyStage, "run", counted)
    upstream = StatusUpstream()
    app, parts = _stack(upstream)
    async with _client(app) as client:
        response = await client.post("/x", content=b"payload")
    assert response.status_code == 200 and used == ["body"] and upstream.calls == 1
    assert parts.limiter.inflight == 0 and parts.capacity is not None
    assert parts.capacity.held == 0


async def test_a_full_limiter_without_queue_sheds_with_limit() -> None:
    """No queue and no free permit: the concurrency stage's ``limit`` shed, nothing upstream."""
    upstream = StatusUpstream()
    app, parts = _stack(upstream, admission_queue={"enabled": False},
                        limiter={"algorithm": "fixed", "fixed_limit": 1})  # fmt: skip
    held = parts.limiter.try_acquire(0.0)
    assert held is not None
    try:
        async with _client(app) as client:
            response = await client.get("/x")
    finally:
        held.release(Outcome.IGNORED, 0.0)
    assert response.status_code == 429 and response.headers["x-ballast-reason"] == "limit"
    assert upstream.calls == 0


async def test_lifespan_goes_through_the_chain() -> None:
    """Non-HTTP scopes are the chain's: lifespan reaches the inner app."""
    messages: list[str] = []

    async def inner(scope: Scope, receive: Receive, send: Send) -> None:
        messages.append(scope["type"])

    app, _ = _stack(inner)
    await app({"type": "lifespan"}, _never, _ignore)
    assert messages == ["lifespan"]


async def _never() -> dict[str, Any]:
    raise AssertionError("not read")


async def _ignore(message: Any) -> None:
    return None
