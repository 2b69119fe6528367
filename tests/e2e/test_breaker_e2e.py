"""Kill and restore a real upstream behind a real gateway: the breaker opens, probes, closes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from tests.e2e.test_gateway_e2e import free_port

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


def _serve(app: Counting, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    limit = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < limit and thread.is_alive()
        time.sleep(0.01)
    return server, thread


def _stop(server: uvicorn.Server, thread: threading.Thread) -> None:
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A gateway with a quick breaker in front of a loopback port (upstream started by tests)."""
    up_port = free_port()
    config = tmp_path / "ballast.yaml"
    config.write_text(
        f"upstream: http://127.0.0.1:{up_port}\n"
        "breaker:\n  open_ms: 300\n  max_open_ms: 600\n  consecutive_failures: 5\n"
    )
    port = free_port()
    env = {**os.environ, "BALLAST_CONFIG": str(config), "BALLAST_UPSTREAM": "",
           "BALLAST_LIMITER": "", "BALLAST_FIXED_LIMIT": ""}  # fmt: skip
    args = [sys.executable, "-m", "uvicorn", "ballast_asgi.gateway:app", "--port", str(port)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        limit = time.monotonic() + 15
        while True:
            assert proc.poll() is None, proc.communicate()[1].decode()
            try:
                httpx.get(base + "/_ballast/health", timeout=0.5)
                break
            except httpx.TransportError:
                assert time.monotonic() < limit, "gateway did not start"
                time.sleep(0.05)
        yield base, up_port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=15)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def test_breaker_opens_sheds_fast_and_closes_when_upstream_returns(
    gateway: tuple[str, int],
) -> None:
    """Upstream down: 502s, then fast breaker_open sheds; upstream back: closed and 200s."""
    base, up_port = gateway
    app = Counting()
    server, thread = _serve(app, up_port)
    try:
        with httpx.Client(base_url=base, timeout=5) as client:
            assert client.get("/x").status_code == 200
            _stop(server, thread)
            statuses = [client.get("/x").status_code for _ in range(30)]
            assert 502 in statuses
            start = time.monotonic()
            shed = client.get("/x")
            assert shed.status_code == 429
            assert shed.headers["x-ballast-reason"] == "breaker_open"
            assert int(shed.headers["retry-after"]) >= 1
            assert time.monotonic() - start < 0.5
            snap = client.get("/_ballast/snapshot").json()
            assert snap["breaker"]["state"] in ("open", "half_open")
            server, thread = _serve(app, up_port)
            limit = time.monotonic() + 10
            while client.get("/x").status_code != 200:
                assert time.monotonic() < limit, "breaker never closed"
                time.sleep(0.05)
            final = client.get("/_ballast/snapshot").json()["breaker"]
        assert final["state"] == "closed"
        assert final["transitions"]["half_open"] >= 1
    finally:
        _stop(server, thread)
