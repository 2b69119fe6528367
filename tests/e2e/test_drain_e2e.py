"""Graceful drain through a SIGTERM: health 503, still served, then every request answered once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.support import (
    HANG_S,
    NO_BALLAST_ENV,
    free_port,
    serve_in_thread,
    stop_thread,
    wait_http,
)

pytestmark = pytest.mark.e2e


class Slow:
    """An upstream that answers after ``?ms=`` milliseconds and counts what it served."""

    def __init__(self) -> None:
        self.started = 0
        self.lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        with self.lock:
            self.started += 1
        ms = int(scope["query_string"].decode().partition("=")[2] or 0)
        await asyncio.sleep(ms / 1000.0)  # the upstream's service time
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})


@pytest.fixture
def slow() -> Iterator[tuple[Slow, str]]:
    """The slow upstream on loopback."""
    app, port = Slow(), free_port()
    server, thread = serve_in_thread(app, port)
    yield app, f"http://127.0.0.1:{port}"
    stop_thread(server, thread)


def _held(base: str) -> int:
    snap = httpx.get(base + "/_ballast/snapshot").json()
    return int(snap["limiter"]["inflight"] + snap["queue"]["total"])


def _get(url: str) -> int:
    with httpx.Client(timeout=30) as client:
        return client.get(url).status_code


def test_sigterm_drains_with_exactly_one_response_per_request(
    slow: tuple[Slow, str], tmp_path: Path
) -> None:
    """In flight and queued requests finish; new ones in the grace period are served; exit 0."""
    app, upstream = slow
    config = tmp_path / "gw.yaml"
    config.write_text(json.dumps({
        "upstream": upstream, "max_concurrent_requests": 5,
        "server": {"drain_grace_ms": 3000, "shutdown_timeout_ms": 15000},
    }))  # fmt: skip
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "ballast_asgi", "--config", str(config),
            "--port", str(port), "--admin-port", "0"]  # fmt: skip
    proc = subprocess.Popen(args, env={**os.environ, **NO_BALLAST_ENV}, stderr=subprocess.PIPE)
    try:
        wait_http(base + "/_ballast/health", proc)
        with ThreadPoolExecutor(max_workers=30) as pool:
            early = [pool.submit(_get, f"{base}/slow?ms=1000") for _ in range(20)]
            limit = time.monotonic() + HANG_S
            # bounded poll: all 20 reached the gateway (in flight, queued or answered)
            while _held(base) + sum(f.done() for f in early) < 20:
                assert time.monotonic() < limit
                time.sleep(0.01)
            proc.send_signal(signal.SIGTERM)
            health = httpx.get(base + "/_ballast/health")
            during = [pool.submit(_get, f"{base}/fast?ms=10") for _ in range(5)]
            statuses = [f.result(timeout=HANG_S) for f in early + during]
        code = proc.wait(timeout=HANG_S)
        stderr = proc.communicate()[1].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert health.status_code == 503 and health.json() == {"status": "draining"}
    assert statuses == [200] * 25
    assert app.started == 25
    assert code == 0 and "draining" in stderr
