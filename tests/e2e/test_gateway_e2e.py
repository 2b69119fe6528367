"""The standalone gateway as a user starts it: uvicorn from the environment, and the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.support import (
    free_port,
    no_drain,
    serve_in_thread,
    stop_process,
    stop_thread,
    wait_http,
)

pytestmark = pytest.mark.e2e

PY = sys.executable


async def upstream(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Echo the path and the forwarded deadline."""
    if scope["type"] != "http":
        return
    deadline = dict(scope["headers"]).get(b"x-deadline-ms", b"")
    body = b'{"path":"%s","deadline":"%s"}' % (scope["path"].encode(), deadline)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def upstream_url() -> Iterator[str]:
    """A real uvicorn upstream on loopback, in a thread."""
    port = free_port()
    server, thread = serve_in_thread(upstream, port)
    yield f"http://127.0.0.1:{port}"
    stop_thread(server, thread)


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    full = {**os.environ, **env}
    return subprocess.Popen(args, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _uvicorn(port: int) -> list[str]:
    return [PY, "-m", "uvicorn", "ballast_asgi.gateway:app", "--port", str(port)]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"BALLAST_UPSTREAM": ""}, "BALLAST_UPSTREAM"),
        ({"BALLAST_UPSTREAM": "http://127.0.0.1:1", "BALLAST_LIMITER": "nope"}, "BALLAST_LIMITER"),
        ({"BALLAST_UPSTREAM": "http://127.0.0.1:1", "BALLAST_FIXED_LIMIT": "x"}, "FIXED_LIMIT"),
        ({"BALLAST_UPSTREAM": "ftp://x"}, "upstream"),
    ],
)
def test_uvicorn_start_up_error_is_one_line(env: dict[str, str], named: str) -> None:
    """A bad setting stops uvicorn at start-up with one line naming it, no traceback."""
    env = {"BALLAST_CONFIG": "", **env}
    proc = subprocess.run(_uvicorn(free_port()), env={**os.environ, **env},
                          capture_output=True, timeout=30)  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode != 0
    assert named in err
    assert "Traceback" not in err


def test_uvicorn_gateway_from_environment(upstream_url: str) -> None:
    """`uvicorn ballast_asgi.gateway:app` proxies and serves /_ballast/* ."""
    port = free_port()
    env = {"BALLAST_UPSTREAM": upstream_url, "BALLAST_LIMITER": "fixed",
           "BALLAST_FIXED_LIMIT": "16", "BALLAST_CONFIG": ""}  # fmt: skip
    proc = _start(_uvicorn(port), env)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/_ballast/health", proc)
        r = httpx.get(base + "/a/b", headers={"X-Deadline-Ms": "1000"})
        assert r.json()["path"] == "/a/b" and 0 < int(r.json()["deadline"]) <= 1000
        snap = httpx.get(base + "/_ballast/snapshot").json()
        assert snap["limiter"]["limit"] == 16 and snap["limiter"]["inflight"] == 0
    finally:
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert stop_process(proc) in (0, -signal.SIGTERM)


def test_cli_traffic_and_admin_ports_and_clean_shutdown(upstream_url: str, tmp_path: Path) -> None:
    """`ballast` serves traffic and admin ports; SIGTERM stops it cleanly."""
    port, admin = free_port(), free_port()
    args = [PY, "-m", "ballast_asgi", "--upstream", upstream_url, "--limiter", "gradient",
            "--port", str(port), "--admin-port", str(admin)]  # fmt: skip
    proc = _start(args, {"BALLAST_CONFIG": str(no_drain(tmp_path))})
    try:
        wait_http(f"http://127.0.0.1:{admin}/metrics", proc)
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        assert httpx.get(f"http://127.0.0.1:{port}/x").json()["path"] == "/x"
        metrics = httpx.get(f"http://127.0.0.1:{admin}/metrics").text
        assert "ballast_concurrency_limit" in metrics
        snap = httpx.get(f"http://127.0.0.1:{admin}/snapshot").json()
        assert snap["config"]["limiter"] == "gradient"
    finally:
        assert stop_process(proc) == 0


def test_check_config(tmp_path: Path) -> None:
    """`ballast check-config` exits 0 on a valid file and non-zero naming the key."""
    good = tmp_path / "good.yaml"
    good.write_text("upstream: http://127.0.0.1:1\nmax_concurrent_requests: 10\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("admission_queue:\n  queue_timeout_ms: 0\n")
    cli = [PY, "-m", "ballast_asgi", "check-config"]
    assert subprocess.run([*cli, str(good)], capture_output=True, timeout=30).returncode == 0
    res = subprocess.run([*cli, str(bad)], capture_output=True, timeout=30)
    assert res.returncode != 0
    assert b"admission_queue.queue_timeout_ms" in res.stderr
