"""Three real simulators behind ``uvicorn ballast_asgi.gateway:app`` with BALLAST_UPSTREAM=a,b,c.

The black-box scenario: traffic is spread fairly; one instance turns into a
503 source mid-run; clients see (almost) no failures and the broken instance
stops receiving traffic within about two seconds; ``/_ballast/snapshot`` has
``upstreams``. Also: a stopped instance (connection refused) costs nothing.
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

import httpx
import pytest

from tests.e2e.support import NO_BALLAST_ENV, enter_together, free_port, stop_process, wait_http

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@contextmanager
def simulator() -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """One upstream_sim (8 workers, 5 ms / 20 ms): (traffic URL, admin URL, process)."""
    port, admin = free_port(), free_port()
    args = [sys.executable, "-m", "upstream_sim", "--port", str(port), "--admin-port",
            str(admin), "--fast", "5ms", "--slow", "20ms", "--seed", "1"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{admin}/health", proc)
        yield f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}", proc
    finally:
        stop_process(proc)


@contextmanager
def pool_gateway(urls: list[str]) -> Iterator[str]:
    """The gateway as a user starts it, over ``urls``."""
    port = free_port()
    env = {**os.environ, **NO_BALLAST_ENV, "BALLAST_UPSTREAM": ",".join(urls), "BALLAST_CONFIG": ""}
    args = [sys.executable, "-m", "uvicorn", "ballast_asgi.gateway:app", "--port", str(port)]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{port}/_ballast/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


async def _traffic(
    client: httpx.AsyncClient, seconds: float, rate: float, posts: bool = False
) -> Counter[int]:
    """Open-loop-ish requests at ``rate`` for ``seconds`` (every other one a POST with a
    body when ``posts``): the statuses (0 = transport error)."""
    statuses: Counter[int] = Counter()

    async def one(method: str) -> None:
        body = b"order=42" if method == "POST" else None
        try:
            r = await client.request(method, "/work", content=body, timeout=5.0)
            statuses[r.status_code] += 1
        except httpx.HTTPError:
            statuses[0] += 1

    tasks = []
    start = time.monotonic()
    for i in range(int(seconds * rate)):
        await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        tasks.append(asyncio.ensure_future(one("POST" if posts and i % 2 else "GET")))
    await asyncio.gather(*tasks)
    return statuses


async def _attempts(client: httpx.AsyncClient) -> list[int]:
    snap = (await client.get("/_ballast/snapshot")).json()
    return [u["requests"] for u in snap["upstreams"]]


async def _scenario(
    base: str, break_it: object, posts: bool = False
) -> tuple[Counter[int], list[int], list[int], dict]:
    async with httpx.AsyncClient(base_url=base) as client:
        before = await _attempts(client)
        fair = await _traffic(client, 1.5, 100, posts)
        spread = [b - a for a, b in zip(before, await _attempts(client), strict=True)]
        await asyncio.to_thread(break_it)  # type: ignore[arg-type]
        broken = await _traffic(client, 2.0, 100, posts)
        mark = await _attempts(client)
        late = await _traffic(client, 1.5, 100, posts)
        tail = [b - a for a, b in zip(mark, await _attempts(client), strict=True)]
        snap = (await client.get("/_ballast/snapshot")).json()
    assert fair == Counter({200: 150})
    return broken + late, spread, tail, snap


def test_503_source_is_isolated_within_two_seconds() -> None:
    """Fair spread; a 503 source costs (almost) no client failures and gets nothing after 2 s."""
    with ExitStack() as stack:
        sims = enter_together(stack, [simulator() for _ in range(3)])
        base = stack.enter_context(pool_gateway([url for url, _, _ in sims]))

        def make_503() -> None:
            body = {"error_rate": 1.0, "error_status": 503}
            assert httpx.post(f"{sims[0][1]}/profile", json=body).status_code == 200

        statuses, spread, tail, snap = asyncio.run(_scenario(base, make_503))
    assert min(spread) >= 150 * 0.2, spread
    assert statuses[200] >= 0.99 * sum(statuses.values()), statuses
    assert tail[0] == 0 and sum(tail) >= 140, tail
    first = snap["upstreams"][0]
    assert first["ejected"] or not first["healthy"]
    assert {"url", "weight", "healthy", "ejected_until_s", "in_flight", "limit"} <= set(first)


def test_stopped_instance_costs_no_client_failure() -> None:
    """A killed instance (connection refused) is retried elsewhere and taken out.

    Half the requests are POSTs: a refused connection means the upstream saw
    nothing, so they are retried on another instance too.
    """
    with ExitStack() as stack:
        sims = enter_together(stack, [simulator() for _ in range(3)])
        base = stack.enter_context(pool_gateway([url for url, _, _ in sims]))
        stop = lambda: stop_process(sims[0][2])  # noqa: E731
        statuses, _, tail, snap = asyncio.run(_scenario(base, stop, posts=True))
    assert statuses == Counter({200: 350}), statuses
    assert tail[0] == 0
    assert snap["upstreams"][0]["ejections"] >= 1 or not snap["upstreams"][0]["healthy"]
