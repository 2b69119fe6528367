"""install() protects a FastAPI app; the example app works."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry

import ballast_asgi
from ballast_asgi.gateway.embed import wrap

pytestmark = pytest.mark.anyio


async def test_example_fastapi_app_is_protected() -> None:
    """The example serves, exposes /_ballast/*, and sheds dead-on-arrival requests."""
    from examples.fastapi_app import app

    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        r = await c.get("/orders/7", headers={"X-Priority": "critical"})
        assert r.status_code == 200
        assert r.json()["priority"] == "critical"
        shed = await c.get("/orders/7", headers={"X-Deadline-Ms": "0"})
        assert shed.status_code == 429 and shed.headers["x-ballast-reason"] == "deadline"
        snap = (await c.get("/_ballast/snapshot")).json()
        assert snap["limiter"]["inflight"] == 0


async def test_install_rules_and_request_state() -> None:
    """Rules from the config classify requests; handlers read request.state.ballast."""
    app = FastAPI()

    @app.post("/reports")
    async def report(request: Request) -> dict[str, str]:
        return {"tier": request.state.ballast.priority.label}

    rules = {"rules": [{"path": "/reports", "methods": ["POST"], "priority": "bulk"}]}
    parts = ballast_asgi.install(app, {"priority": rules}, registry=CollectorRegistry())
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://a") as c:
        assert (await c.post("/reports")).json() == {"tier": "bulk"}
    assert parts.limiter.inflight == 0


async def test_wrap_plain_asgi_app_and_lifespan_passthrough() -> None:
    """wrap() protects a raw ASGI app and passes lifespan through untouched."""
    seen: list[str] = []

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        seen.append(str(scope["type"]))
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
            await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    wrapped = wrap(app, limiter="fixed")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(wrapped), base_url="http://a") as c:
        assert (await c.get("/")).text == "ok"

    async def receive() -> dict[str, object]:
        return {"type": "lifespan.startup"}

    async def send(message: dict[str, object]) -> None:
        return None

    await wrapped({"type": "lifespan"}, receive, send)
    assert seen == ["http", "lifespan"]
