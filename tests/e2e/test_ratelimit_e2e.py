"""Two real uvicorn gateways sharing one real redis-server: the limit holds across them.

Most tests run the two gateways as uvicorn servers in threads of the test
process (each with its own event loop, Redis pool and state; lifespan on, so
shutdown closes the limiter); the Redis-kill test runs them as separate
``uvicorn ballast_asgi.gateway:app`` processes, started in parallel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml

from ballast_asgi.config import load_config
from ballast_asgi.gateway import build_gateway
from experiments._harness.redis import RedisProcess, redis_server
from tests.e2e.support import (
    HANG_S,
    NO_BALLAST_ENV,
    free_port,
    serve_in_thread,
    stop_process,
    stop_thread,
    wait_http,
)

pytestmark = pytest.mark.e2e

RATE, BURST = 5.0, 20


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    """A trivial upstream on loopback."""
    port = free_port()
    server, thread = serve_in_thread(_ok, port)
    yield f"http://127.0.0.1:{port}"
    stop_thread(server, thread)


@pytest.fixture
def redis() -> Iterator[RedisProcess]:
    """A fresh redis-server per test (one test kills it)."""
    with redis_server() as server:
        yield server


def _config(tmp: Path, upstream: str, redis_url: str, mode: str, name: str) -> Path:
    section = {
        "enabled": True, "mode": mode, "redis_url": redis_url, "key": "header:X-Tenant",
        "rate_per_s": RATE, "burst": BURST, "redis_timeout_ms": 200, "sync_interval_ms": 20,
        "heartbeat_ms": 100,
    }  # fmt: skip
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"upstream": upstream, "rate_limit": section}))
    return path


@contextmanager
def _gateway_thread(config: Path) -> Iterator[str]:
    """The gateway on uvicorn in a thread, lifespan on; its base URL."""
    port = free_port()
    app = build_gateway(load_config(env={}, path=config))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    limit = time.monotonic() + HANG_S
    while not server.started:  # readiness poll, bounded
        assert time.monotonic() < limit and thread.is_alive(), "gateway did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_thread(server, thread)


def _pair(stack: ExitStack, tmp: Path, upstream: str, url: str, mode: str) -> list[str]:
    return [
        stack.enter_context(_gateway_thread(_config(tmp, upstream, url, mode, f"g{i}")))
        for i in range(2)
    ]


@contextmanager
def _process_pair(configs: list[Path]) -> Iterator[list[str]]:
    """Two ``uvicorn ballast_asgi.gateway:app`` processes started in parallel."""
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        for config in configs:
            port = free_port()
            env = {**os.environ, "BALLAST_CONFIG": str(config), **NO_BALLAST_ENV}
            args = [
                sys.executable,
                "-m",
                "uvicorn",
                "ballast_asgi.gateway:app",
                "--port",
                str(port),
            ]
            proc = subprocess.Popen(
                args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            procs.append((f"http://127.0.0.1:{port}", proc))
        for base, proc in procs:
            wait_http(base + "/_ballast/health", proc)
        yield [base for base, _ in procs]
    finally:
        for _, proc in procs:
            stop_process(proc)


def _drive(bases: list[str], n: int, gap_s: float = 0.004) -> tuple[list[int], float]:
    statuses: list[int] = []
    worst = 0.0
    with httpx.Client(timeout=5.0) as client:
        for i in range(n):
            start = time.perf_counter()
            r = client.get(bases[i % len(bases)] + "/x", headers={"x-tenant": "t1"})
            worst = max(worst, time.perf_counter() - start)
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert r.headers["x-ballast-reason"] == "rate_limited"
                assert int(r.headers["retry-after"]) >= 1 and "ratelimit" in r.headers
            time.sleep(gap_s)  # pacing the offered load (open-loop-ish), not a correctness wait
    return statuses, worst


@pytest.mark.parametrize("mode", ["redis", "lease", "sync"])
def test_shared_modes_hold_one_limit_across_two_gateways(
    tmp_path: Path, upstream: str, redis: RedisProcess, mode: str
) -> None:
    """Two gateways over one key admit about what one perfect bucket admits, not twice it."""
    with ExitStack() as stack:
        bases = _pair(stack, tmp_path, upstream, redis.url, mode)
        start = time.monotonic()
        statuses, _ = _drive(bases, 120)
        elapsed = time.monotonic() - start
        snap = httpx.get(bases[0] + "/_ballast/snapshot").json()["rate_limit"]
    admitted = statuses.count(200)
    perfect = BURST + RATE * elapsed
    assert set(statuses) <= {200, 429}
    assert 0.75 * perfect <= admitted <= 1.15 * perfect + 2, (admitted, perfect)
    assert snap["mode"] == mode and snap["live_gateways"] == 2


def test_local_mode_is_per_gateway(tmp_path: Path, upstream: str, redis: RedisProcess) -> None:
    """In local mode each gateway has its own bucket: two admit about twice the burst."""
    with ExitStack() as stack:
        bases = _pair(stack, tmp_path, upstream, redis.url, "local")
        statuses, _ = _drive(bases, 80, gap_s=0.0)
    assert statuses.count(200) >= 2 * BURST


def test_killing_redis_degrades_to_local_decisions(
    tmp_path: Path, upstream: str, redis: RedisProcess
) -> None:
    """With Redis killed mid-run every request still gets 200 or 429 quickly, on local shares."""
    configs = [_config(tmp_path, upstream, redis.url, "redis", f"p{i}") for i in range(2)]
    with _process_pair(configs) as bases:
        before, _ = _drive(bases, 30)
        redis.kill()
        after, worst = _drive(bases, 60)
        snaps = [httpx.get(b + "/_ballast/snapshot").json()["rate_limit"] for b in bases]
    assert set(before + after) <= {200, 429} and worst < 0.5
    # Decided locally once Redis is gone: allowed or denied (how many of each is timing).
    degraded = sum(n for s in snaps for k, n in s["decisions"].items() if k.endswith("/degraded"))
    assert degraded >= 1 and after.count(429) >= 1


@pytest.mark.parametrize("mode", ["redis", "lease"])
def test_ballast_workers_share_one_limit_through_redis(
    tmp_path: Path, upstream: str, redis: RedisProcess, mode: str
) -> None:
    """`ballast --workers 2` in a shared mode: one burst across both workers, each a live peer."""
    section = {"enabled": True, "mode": mode, "redis_url": redis.url, "key": "header:X-Tenant",
               "rate_per_s": 0.01, "burst": 10, "redis_timeout_ms": 1000}  # fmt: skip
    config = tmp_path / "workers.yaml"
    config.write_text(yaml.safe_dump({"upstream": upstream, "rate_limit": section,
                                      "server": {"drain_grace_ms": 0}}))  # fmt: skip
    port, admin = free_port(), free_port()
    args = [sys.executable, "-m", "ballast_asgi", "--config", str(config), "--port",
            str(port), "--admin-port", str(admin), "--workers", "2"]  # fmt: skip
    proc = subprocess.Popen(args, env={**os.environ, **NO_BALLAST_ENV}, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{admin}/health", proc)
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        codes = []
        for _ in range(30):
            with httpx.Client() as client:  # a new connection each time: both workers serve
                r = client.get(f"http://127.0.0.1:{port}/x", headers={"X-Tenant": "t1"})
                codes.append(r.status_code)
        for _ in range(100):  # both started at once: the next heartbeat (1 s) counts the peer
            snap = httpx.get(f"http://127.0.0.1:{admin}/snapshot").json()
            if all(w["rate_limit"]["live_gateways"] == 2 for w in snap["workers"]):
                break
            time.sleep(0.05)
    finally:
        stop_process(proc)
    workers = [w["rate_limit"] for w in snap["workers"]]
    served = [sum(w["decisions"].get(k, 0) for k in w["decisions"]) for w in workers]
    assert set(codes) == {200, 429}, codes
    if mode == "redis":  # every decision in Redis: exactly the burst
        assert codes.count(200) == 10, codes
    else:  # never over the burst (exact). Under it by lease granularity: a worker may hold
        # tokens it is not asked to spend, given back only after ``lease.ttl_ms``, while the
        # other refuses locally until a quarter lease refills (docs/ratelimit.md). How many
        # of the 30 quick requests land before that is timing: 8-10 on a quiet machine, 7
        # once in a fresh-clone run (stop 40), so the lower bound is most of the burst.
        assert 6 <= codes.count(200) <= 10, codes
    assert [w["live_gateways"] for w in workers] == [2, 2]
    assert all(n > 0 for n in served), served  # both workers decided some of them
    assert all(w["decisions"].get("allowed/degraded", 0) == 0 for w in workers)
