"""Real uvicorn gateway on loopback: queue order, disconnects, dead on arrival, SIGHUP reload."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.support import HANG_S, free_port, serve_in_thread, stop_thread, uvicorn_gateway

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


class HeldUpstream:
    """An upstream that holds every request until `/_release` lets the oldest one go."""

    def __init__(self) -> None:
        self.arrivals: list[str] = []
        self.waiting: list[asyncio.Future[None]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if path == "/_release":
            if self.waiting:
                self.waiting.pop(0).set_result(None)
        elif path != "/_state":
            self.arrivals.append(path)
            future = asyncio.get_running_loop().create_future()
            self.waiting.append(future)
            await future
        body = str(len(self.waiting)).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture
def held() -> Iterator[tuple[HeldUpstream, str]]:
    """The held upstream served by uvicorn in a thread."""
    app = HeldUpstream()
    port = free_port()
    server, thread = serve_in_thread(app, port)
    yield app, f"http://127.0.0.1:{port}"
    for future in app.waiting:
        future.get_loop().call_soon_threadsafe(_resolve, future)
    stop_thread(server, thread)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@pytest.fixture
def gateway(tmp_path: Path, held: tuple[HeldUpstream, str]) -> Iterator[tuple[str, Path, int]]:
    """`uvicorn ballast_asgi.gateway:app` with a fixed limit of 1 and a LIFO threshold of 2."""
    config = tmp_path / "ballast.yaml"
    config.write_text(
        f"upstream: {held[1]}\nlimiter:\n  algorithm: fixed\n  fixed_limit: 1\n"
        "admission_queue:\n  lifo_threshold: 2\nretry:\n  enabled: false\n"
    )
    with uvicorn_gateway(config) as (base, pid):
        yield base, config, pid


async def _until(check: Any, what: str, seconds: float = HANG_S) -> None:
    """Poll ``check()`` (an awaitable factory) until true; bounded."""
    limit = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < limit, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _snapshot(client: httpx.AsyncClient) -> dict[str, Any]:
    return (await client.get("/_ballast/snapshot")).json()  # type: ignore[no-any-return]


async def test_critical_overtakes_bulk_and_lifo_tail(
    gateway: tuple[str, Path, int], held: tuple[HeldUpstream, str]
) -> None:
    """One permit: critical goes first; bulk above the threshold is served newest first."""
    base, _, _ = gateway
    upstream, up_url = held
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:

        async def queued(n: int) -> bool:
            return bool((await _snapshot(client))["queue"]["total"] == n)

        tasks = [asyncio.create_task(client.get("/hold", headers={"X-Priority": "bulk"}))]
        await _until(lambda: _true(len(upstream.arrivals) == 1), "the first request upstream")
        for i, tier in enumerate(["bulk", "bulk", "bulk", "bulk", "critical"]):
            path = f"/{tier}{i}"
            tasks.append(asyncio.create_task(client.get(path, headers={"X-Priority": tier})))
            await _until(lambda i=i: queued(i + 1), f"{path} to queue")
        async with httpx.AsyncClient(base_url=up_url) as up:
            for served in range(2, 7):
                await up.get("/_release")
                await _until(lambda s=served: _true(len(upstream.arrivals) == s), "next grant")
            await up.get("/_release")
        responses = await asyncio.gather(*tasks)
        snap = await _snapshot(client)
    assert [r.status_code for r in responses] == [200] * 6
    # bulk depth 4 > 2: newest first (bulk3, bulk2); then depth 2 <= 2: FIFO (bulk0, bulk1).
    assert upstream.arrivals == ["/hold", "/critical4", "/bulk3", "/bulk2", "/bulk0", "/bulk1"]
    assert snap["limiter"]["inflight"] == 0 and snap["queue"]["total"] == 0


async def _true(value: bool) -> bool:
    return value


async def test_disconnected_waiters_cost_no_upstream_work(
    gateway: tuple[str, Path, int], held: tuple[HeldUpstream, str]
) -> None:
    """Clients that give up while queued are removed; in-flight returns to zero."""
    base, _, _ = gateway
    upstream, up_url = held
    async with httpx.AsyncClient(base_url=base, timeout=20) as client:
        hold = asyncio.create_task(client.get("/hold"))
        await _until(lambda: _true(len(upstream.arrivals) == 1), "the held request")
        impatient = httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(0.3))
        async with impatient:
            results = await asyncio.gather(
                *(impatient.get(f"/gone{i}") for i in range(40)), return_exceptions=True
            )
        assert all(isinstance(r, httpx.TimeoutException) for r in results)

        async def drained() -> bool:
            return bool((await _snapshot(client))["queue"]["total"] == 0)

        await _until(drained, "the queue to drop the disconnected waiters")
        async with httpx.AsyncClient(base_url=up_url) as up:
            await up.get("/_release")
        assert (await hold).status_code == 200
        dead = await client.get("/doa", headers={"X-Deadline-Ms": "0"})
        snap = await _snapshot(client)
    assert dead.status_code == 429 and dead.headers["x-ballast-reason"] == "deadline"
    assert upstream.arrivals == ["/hold"]
    assert snap["limiter"]["inflight"] == 0 and snap["queue"]["total"] == 0


async def test_sighup_reloads_the_config_file(gateway: tuple[str, Path, int]) -> None:
    """SIGHUP to a uvicorn-run gateway re-reads BALLAST_CONFIG and applies the new limit."""
    base, config, pid = gateway
    text = config.read_text().replace("fixed_limit: 1", "fixed_limit: 7")
    config.write_text(text)
    os.kill(pid, signal.SIGHUP)
    async with httpx.AsyncClient(base_url=base) as client:

        async def reloaded() -> bool:
            snap = await _snapshot(client)
            return bool(snap["config"]["version"] == 2 and snap["limiter"]["limit"] == 7)

        await _until(reloaded, "the reload")
