"""Three real instances of an app without ``/health`` behind ``BALLAST_UPSTREAM=a,b,c``.

The issue-30 scenario: with default settings the pool must still fail over.
One instance turns into a 503 source mid-run; at most 1 % of client requests
fail and the broken instance gets no client request 2 s after it broke.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.e2e.support import (
    HANG_S,
    NO_BALLAST_ENV,
    enter_together,
    free_port,
    stop_process,
    wait_http,
)
from tests.e2e.test_pool_e2e import _traffic

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def no_health_app() -> Iterator[str]:
    """One uvicorn running ``tests.e2e.nohealth_app`` (404 at /health): its base URL."""
    port = free_port()
    args = [sys.executable, "-m", "uvicorn", "tests.e2e.nohealth_app:app", "--port", str(port),
            "--log-level", "warning", "--lifespan", "off"]  # fmt: skip
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/_ctl/stats", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


@contextmanager
def gateway(urls: list[str], log: list[str]) -> Iterator[str]:
    """``uvicorn ballast_asgi.gateway:app`` over ``urls``; its stderr lands in ``log``."""
    port = free_port()
    env = {**os.environ, **NO_BALLAST_ENV, "BALLAST_UPSTREAM": ",".join(urls), "BALLAST_CONFIG": ""}
    args = [sys.executable, "-m", "uvicorn", "ballast_asgi.gateway:app", "--port", str(port)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.terminate()
        _, err = proc.communicate(timeout=HANG_S)
        log.append(err.decode(errors="replace"))


async def _requests(client: httpx.AsyncClient) -> list[int]:
    snap = (await client.get("/_ballast/snapshot")).json()
    return [u["requests"] for u in snap["upstreams"]]


async def _run(base: str, bad: str) -> tuple[Counter[int], list[int], dict, dict]:
    async with httpx.AsyncClient(base_url=base) as client:
        fair = await _traffic(client, 1.5, 100)
        assert fair == Counter({200: 150}), fair
        assert (await client.post(f"{bad}/_ctl/fail")).status_code == 200
        broken = await _traffic(client, 2.0, 100)
        mark = await _requests(client)
        late = await _traffic(client, 1.5, 100)
        tail = [b - a for a, b in zip(mark, await _requests(client), strict=True)]
        snap = (await client.get("/_ballast/snapshot")).json()
        stats = (await client.get(f"{bad}/_ctl/stats")).json()
    return broken + late, tail, snap, stats


def test_503_source_without_health_endpoint_is_isolated() -> None:
    """No /health anywhere: <= 1 % client failures, the 503 source is out within 2 s."""
    log: list[str] = []
    with ExitStack() as stack:
        urls = enter_together(stack, [no_health_app() for _ in range(3)])
        base = stack.enter_context(gateway(urls, log))
        started = time.monotonic()
        statuses, tail, snap, stats = asyncio.run(_run(base, urls[0]))
        assert time.monotonic() - started < 60
    total = sum(statuses.values())
    failed = total - statuses[200]
    isolated_s = stats["last_after"] - stats["failing_since"]
    print(f"\nclient failures {failed}/{total}; last request on the 503 source "
          f"{isolated_s:.3f} s after it broke; tail {tail}")  # fmt: skip
    assert failed <= 0.01 * total, statuses
    assert isolated_s <= 2.0, stats
    assert tail[0] == 0 and sum(tail) >= 140, tail
    assert not any(u["panic"] for u in snap["upstreams"]), snap["upstreams"]
    assert snap["pool"] == {"panic": False, "warnings": [], "waiting_for_discovery": False}
    bad = urls[0].removeprefix("http://")
    lines = log[0].splitlines()
    assert any("pool.instance_ejected" in ln and bad in ln for ln in lines), log[0]
    assert any("pool.instance_unhealthy" in ln and "status 503" in ln for ln in lines), log[0]
