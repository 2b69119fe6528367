"""The optional JSON access log: one line per request with its fate; off by default."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import pytest

from ballast_asgi.config import build_config
from ballast_asgi.gateway import build_gateway
from ballast_asgi.ops.access_log import AccessLog

pytestmark = pytest.mark.anyio


def _gateway(**data: Any) -> Any:
    config = build_config({"upstream": "http://up.test", **data})
    transport = httpx.MockTransport(lambda r: httpx.Response(201, text="made"))
    return build_gateway(config, transport=transport, env={})


async def _lines(gw: Any, requests: list[tuple[str, dict[str, str]]]) -> list[dict[str, Any]]:
    stream = io.StringIO()
    assert isinstance(gw._app, AccessLog)
    gw._app.stream = stream
    async with httpx.AsyncClient(transport=httpx.ASGITransport(gw), base_url="http://gw") as c:
        for path, headers in requests:
            await c.get(path, headers=headers)
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_served_request_is_one_line_with_its_fate() -> None:
    """Method, path (no query), route, status, tier, queue wait, upstream and duration."""
    gw = _gateway(access_log={"enabled": True})
    first, line = await _lines(
        gw, [("/api/y", {}), ("/api/x?secret=1", {"X-Priority": "critical"})]
    )
    assert first["route"] == "other"  # a segment gets its route once the upstream knew it
    assert line["method"] == "GET" and line["path"] == "/api/x" and line["status"] == 201
    assert line["route"] == "/api"
    assert line["priority"] == "critical" and line["shed"] is None
    assert line["queue_wait_ms"] >= 0 and line["duration_ms"] >= 0
    assert line["upstream"] == "http://up.test"
    assert "secret" not in json.dumps(line)


async def test_shed_request_names_its_reason_and_tier() -> None:
    """A request shed at admission (deadline spent) logs the reason and its tier."""
    gw = _gateway(access_log={"enabled": True})
    [line] = await _lines(gw, [("/x", {"X-Deadline-Ms": "0", "X-Priority": "bulk"})])
    assert line["status"] == 429 and line["shed"] == "deadline" and line["priority"] == "bulk"
    assert line["queue_wait_ms"] is None and line["upstream"] is None and line["route"] is None


def test_off_by_default() -> None:
    """Without access_log.enabled there is no access-log layer at all."""
    assert not isinstance(_gateway()._app, AccessLog)
