"""Admin endpoints answer before the stack and never reach the wrapped app."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ballast_asgi.ops.admin import AdminRouter
from ballast_asgi.telemetry.metrics import null_metrics
from tests.fakes import StatusUpstream

pytestmark = pytest.mark.anyio


def _router(app: StatusUpstream | None, token: str | None = None) -> AdminRouter:
    metrics = null_metrics()
    metrics.bind_limiter(lambda: 7, lambda: 3)

    async def reload() -> tuple[bool, str]:
        return True, "reloaded"

    return AdminRouter(
        app,
        exposition=metrics.exposition,
        snapshot=lambda: {"limiter": {"limit": 7}},
        reload=reload,
        token=lambda: token,
        prefix="/_ballast" if app is not None else "",
    )


def _client(app: AdminRouter) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw")


async def test_metrics_parse_and_never_reach_app() -> None:
    """/_ballast/metrics is valid Prometheus text and is not proxied."""
    up = StatusUpstream(body=b"app")
    async with _client(_router(up)) as c:
        r = await c.get("/_ballast/metrics")
    assert r.status_code == 200 and up.calls == 0
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    assert families["ballast_concurrency_limit"].samples[0].value == 7
    assert families["ballast_inflight_requests"].samples[0].value == 3
    assert "ballast_shed" in families


async def test_snapshot_and_health() -> None:
    """Snapshot is JSON; health says ok."""
    async with _client(_router(StatusUpstream(body=b"app"))) as c:
        assert (await c.get("/_ballast/snapshot")).json() == {"limiter": {"limit": 7}}
        assert (await c.get("/_ballast/health")).json() == {"status": "ok"}


async def test_other_paths_pass_through() -> None:
    """Everything outside the prefix goes to the app, including look-alikes."""
    up = StatusUpstream(body=b"app")
    async with _client(_router(up)) as c:
        assert (await c.get("/api")).text == "app"
        assert (await c.get("/_ballastic")).text == "app"
        assert (await c.get("/_ballast/nope")).status_code == 404
    assert up.calls == 2


async def test_admin_port_app_serves_root_paths() -> None:
    """With no app and no prefix, /metrics and /snapshot live at the root."""
    async with _client(_router(None)) as c:
        assert (await c.get("/metrics")).status_code == 200
        assert (await c.get("/snapshot")).json()["limiter"]["limit"] == 7
        assert (await c.get("/elsewhere")).status_code == 404


async def test_reload_disabled_without_token() -> None:
    """POST reload is 404 unless an admin token is configured."""
    async with _client(_router(StatusUpstream(body=b"app"))) as c:
        assert (await c.post("/_ballast/reload")).status_code == 404


async def test_reload_requires_token() -> None:
    """With a token: 401 without it, 200 with it, 405 for GET."""
    async with _client(_router(StatusUpstream(body=b"app"), token="s3cret")) as c:
        assert (await c.post("/_ballast/reload")).status_code == 401
        bad = {"Authorization": "Bearer nope"}
        assert (await c.post("/_ballast/reload", headers=bad)).status_code == 401
        good = {"Authorization": "Bearer s3cret"}
        r = await c.post("/_ballast/reload", headers=good)
        assert r.status_code == 200 and r.json()["reloaded"] is True
        assert (await c.get("/_ballast/reload", headers=good)).status_code == 405
