"""A gateway loses Redis and its upstream: one log line for each, health ``degraded``.

Real processes: redis-server, the upstream (uvicorn), the ``ballast`` CLI. The
gateway's stderr goes to a file read while it runs; polls are bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from experiments._harness.redis import start_redis
from tests.e2e.support import HANG_S, NO_BALLAST_ENV, free_port, stop_process, wait_http

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def _until(check: Callable[[], bool], seconds: float = HANG_S) -> bool:
    limit = time.monotonic() + seconds
    while not check():
        if time.monotonic() > limit:
            return False
        time.sleep(0.05)  # polling an outside process, bounded
    return True


def _events(log: Path) -> list[dict[str, object]]:
    return [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]


def test_redis_stopped_and_upstream_killed_are_logged_and_health_degraded(
    tmp_path: Path,
) -> None:
    """Redis lost, the upstream refusing, Redis back: a JSON line each; health says why."""
    redis = start_redis()
    up_port, port = free_port(), free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.e2e.nohealth_app:app", "--port", str(up_port),
         "--log-level", "warning", "--lifespan", "off"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"upstream: http://127.0.0.1:{up_port}\nserver: {{drain_grace_ms: 0}}\n"
        f"rate_limit: {{enabled: true, mode: redis, redis_url: '{redis.url}', "
        "rate_per_s: 1000, burst: 1000}\n"
    )
    log = tmp_path / "stderr.log"
    args = [sys.executable, "-m", "ballast_asgi", "--config", str(config), "--port",
            str(port), "--admin-port", "0", "--log-format", "json"]  # fmt: skip
    with log.open("wb") as err:
        gw = subprocess.Popen(args, env={**os.environ, **NO_BALLAST_ENV}, stderr=err)
    base = f"http://127.0.0.1:{port}"
    health = f"{base}/_ballast/health"
    try:
        wait_http(f"http://127.0.0.1:{up_port}/_ctl/stats", upstream)
        wait_http(health, gw)
        assert httpx.get(f"{base}/x").status_code == 200
        assert httpx.get(health).json() == {"status": "ok"}
        redis.kill()
        assert _until(lambda: any(e["event"] == "ratelimit.redis_lost" for e in _events(log)))
        assert _until(lambda: httpx.get(health).json()["status"] == "degraded")
        upstream.kill()
        upstream.wait(timeout=HANG_S)
        assert httpx.get(f"{base}/x").status_code == 502
        assert _until(lambda: any(e["event"] == "upstream.connect_error" for e in _events(log)))
        doc = httpx.get(health)
        assert doc.status_code == 200 and doc.json()["status"] == "degraded"
        assert any("Redis" in r for r in doc.json()["reasons"]), doc.json()
        redis = start_redis(redis.port)
        assert _until(lambda: any(e["event"] == "ratelimit.redis_back" for e in _events(log)))
        assert _until(lambda: httpx.get(health).json() == {"status": "ok"})
    finally:
        stop_process(gw)
        if upstream.poll() is None:
            upstream.kill()
            upstream.wait(timeout=HANG_S)
        redis.stop()
    events = {e["event"]: e for e in _events(log)}
    lost = events["ratelimit.redis_lost"]
    assert lost["level"] == "warning" and lost["mode"] == "redis" and "error" in lost
    assert events["upstream.connect_error"]["upstream"] == f"http://127.0.0.1:{up_port}"
    assert float(events["ratelimit.redis_back"]["down_s"]) > 0  # type: ignore[arg-type]
    assert events["priority.header_trusted_from_anyone"]["level"] == "warning"  # the default
