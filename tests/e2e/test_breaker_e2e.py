"""Kill and restore a real upstream behind a real gateway: the breaker opens, probes, closes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.support import HANG_S, free_port, serve_in_thread, stop_thread, uvicorn_gateway

pytestmark = pytest.mark.e2e


class Counting:
    """An upstream that counts what it served."""

    def __init__(self) -> None:
        self.served = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        self.served += 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A gateway with a quick breaker in front of a loopback port (upstream started by tests)."""
    up_port = free_port()
    config = tmp_path / "ballast.yaml"
    config.write_text(
        f"upstream: http://127.0.0.1:{up_port}\n"
        "breaker:\n  open_ms: 300\n  max_open_ms: 600\n  consecutive_failures: 5\n"
    )
    with uvicorn_gateway(config) as (base, _):
        yield base, up_port


def test_breaker_opens_sheds_fast_and_closes_when_upstream_returns(
    gateway: tuple[str, int],
) -> None:
    """Upstream down: 502s, then fast 503 breaker_open sheds; upstream back: closed and 200s."""
    base, up_port = gateway
    app = Counting()
    server, thread = serve_in_thread(app, up_port)
    try:
        with httpx.Client(base_url=base, timeout=5) as client:
            assert client.get("/x").status_code == 200
            stop_thread(server, thread)
            statuses = [client.get("/x").status_code for _ in range(30)]
            assert 502 in statuses
            start = time.monotonic()
            shed = client.get("/x")
            assert shed.status_code == 503
            assert shed.headers["x-ballast-reason"] == "breaker_open"
            assert int(shed.headers["retry-after"]) >= 1
            assert time.monotonic() - start < 0.5
            snap = client.get("/_ballast/snapshot").json()
            assert snap["routes"]["/x"]["breaker"]["state"] in ("open", "half_open")
            server, thread = serve_in_thread(app, up_port)
            limit = time.monotonic() + HANG_S
            while client.get("/x").status_code != 200:
                assert time.monotonic() < limit, "breaker never closed"
                time.sleep(0.05)
            final = client.get("/_ballast/snapshot").json()["routes"]["/x"]["breaker"]
        assert final["state"] == "closed"
        assert final["transitions"]["half_open"] >= 1
    finally:
        stop_thread(server, thread)
