"""The standalone gateway as a user starts it: uvicorn from the environment, and the CLI."""

from __future__ import annotations

import os
import signal
import socket
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

pytestmark = pytest.mark.e2e

PY = sys.executable


def free_port() -> int:
    """An unused loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    server = uvicorn.Server(
        uvicorn.Config(upstream, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    limit = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < limit and thread.is_alive()
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _wait_http(url: str, proc: subprocess.Popen[bytes]) -> None:
    limit = time.monotonic() + 15
    while time.monotonic() < limit:
        assert proc.poll() is None, proc.communicate()[1].decode()
        try:
            httpx.get(url, timeout=0.5)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError(f"{url} never answered")


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    full = {**os.environ, **env}
    return subprocess.Popen(args, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=15)  # also closes the pipes
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode


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
        _wait_http(base + "/_ballast/health", proc)
        r = httpx.get(base + "/a/b", headers={"X-Deadline-Ms": "1000"})
        assert r.json()["path"] == "/a/b" and 0 < int(r.json()["deadline"]) <= 1000
        snap = httpx.get(base + "/_ballast/snapshot").json()
        assert snap["limiter"]["limit"] == 16 and snap["limiter"]["inflight"] == 0
    finally:
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert _stop(proc) in (0, -signal.SIGTERM)


def test_cli_traffic_and_admin_ports_and_clean_shutdown(upstream_url: str) -> None:
    """`ballast` serves traffic and admin ports; SIGTERM stops it cleanly."""
    port, admin = free_port(), free_port()
    args = [PY, "-m", "ballast_asgi.cli", "--upstream", upstream_url, "--limiter", "gradient",
            "--port", str(port), "--admin-port", str(admin)]  # fmt: skip
    proc = _start(args, {"BALLAST_CONFIG": ""})
    try:
        _wait_http(f"http://127.0.0.1:{admin}/metrics", proc)
        _wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        assert httpx.get(f"http://127.0.0.1:{port}/x").json()["path"] == "/x"
        metrics = httpx.get(f"http://127.0.0.1:{admin}/metrics").text
        assert "ballast_concurrency_limit" in metrics
        snap = httpx.get(f"http://127.0.0.1:{admin}/snapshot").json()
        assert snap["config"]["limiter"] == "gradient"
    finally:
        assert _stop(proc) == 0


def test_check_config(tmp_path: Path) -> None:
    """`ballast check-config` exits 0 on a valid file and non-zero naming the key."""
    good = tmp_path / "good.yaml"
    good.write_text("upstream: http://127.0.0.1:1\nmax_concurrent_requests: 10\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("admission_queue:\n  queue_timeout_ms: 0\n")
    cli = [PY, "-m", "ballast_asgi.cli", "check-config"]
    assert subprocess.run([*cli, str(good)], capture_output=True, timeout=30).returncode == 0
    res = subprocess.run([*cli, str(bad)], capture_output=True, timeout=30)
    assert res.returncode != 0
    assert b"admission_queue.queue_timeout_ms" in res.stderr
