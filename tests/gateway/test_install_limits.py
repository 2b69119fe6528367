"""In an app its own limits rule (no gateway body cap unless set); the snapshot names the pid."""

from __future__ import annotations

import os

import httpx
import pytest
from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry

import ballast_asgi
from ballast_asgi.config import GatewayConfig

TWELVE_MB = 12 * 1000 * 1000


def _app(config: object = None, limiter: str | None = None) -> FastAPI:
    app = FastAPI()

    @app.post("/upload")
    async def upload(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    ballast_asgi.install(app, config, limiter=limiter, registry=CollectorRegistry())  # type: ignore[arg-type]
    return app


async def _post(app: FastAPI, path: str = "/upload") -> httpx.Response:
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        return await client.post(path, content=b"x" * TWELVE_MB)


@pytest.mark.anyio
async def test_a_12_mb_upload_reaches_the_handler_by_default() -> None:
    """No body cap of the gateway's in an app: the handler gets all 12 MB (was 413)."""
    for app in (_app(), _app(limiter="fixed"), _app(GatewayConfig(), limiter="gradient")):
        r = await _post(app)
        assert r.status_code == 200 and r.json() == {"bytes": TWELVE_MB}


@pytest.mark.anyio
async def test_an_explicit_body_cap_still_applies() -> None:
    """``proxy.max_body_bytes`` set in the install config is enforced (413)."""
    capped = {"proxy": {"max_body_bytes": 1_000_000}}
    for config in (capped, GatewayConfig.model_validate(capped)):
        r = await _post(_app(config, limiter="fixed"))
        assert r.status_code == 413 and "1000000 bytes" in r.text, r.text


@pytest.mark.anyio
async def test_snapshot_names_the_process() -> None:
    """``/_ballast/snapshot`` says which process answered (limits are per process)."""
    transport = httpx.ASGITransport(_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        doc = (await client.get("/_ballast/snapshot")).json()
    assert doc["worker"] == {"pid": os.getpid(), "limits": "per_process"}
