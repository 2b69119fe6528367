"""Real simulator on loopback: path classes set live through /profile, hostile bodies refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from ballast_tools.upstream_sim.model import Profile
from ballast_tools.upstream_sim.server import RunningSim, start_sim

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


@pytest.fixture
async def sim() -> AsyncIterator[RunningSim]:
    """A simulator with 4 instant workers on free loopback ports."""
    running = await start_sim(Profile(workers=4, fast_s=0.0, slow_s=0.0), seed=1)
    try:
        yield running
    finally:
        await running.stop()


async def test_classes_set_live_separate_fast_from_slow(sim: RunningSim) -> None:
    """With /slow at 1 worker x 0.3 s, two /slow requests take two rounds; /fast is not held."""
    async with httpx.AsyncClient(base_url=sim.admin_url) as admin:
        r = await admin.post(
            "/profile", json={"paths": [{"prefix": "/slow", "workers": 1, "service": "300ms"}]}
        )
        assert r.status_code == 200
    async with httpx.AsyncClient(base_url=sim.url, timeout=5) as c:
        start = time.monotonic()
        slow = asyncio.gather(c.get("/slow/a"), c.get("/slow/b"))
        fast = await c.get("/fast")
        fast_s = time.monotonic() - start
        answers = await slow
        slow_s = time.monotonic() - start
    assert fast.status_code == 200 and [a.status_code for a in answers] == [200, 200]
    assert slow_s >= 0.55  # two rounds on the one /slow worker
    assert fast_s < slow_s - 0.2  # /fast did not wait for them


@pytest.mark.parametrize(
    "content",
    [
        b'{"paths": ['
        + b",".join([b'{"prefix": "/a", "workers": 1, "service": "1ms"}'] * 5000)
        + b"]}",
        b'{"paths": [{"prefix": "/\\u0000", "workers": 1, "service": "1ms"}]}',
        b'{"paths": [{"prefix": "/a", "workers": 99999999999999999999, "service": "1ms"}]}',
        b'{"paths": {"prefix": "/a"}}',
    ],
)
async def test_hostile_paths_bodies_are_refused(sim: RunningSim, content: bytes) -> None:
    """Huge, NUL-bearing, overflowing or mistyped paths get 422; the profile is unchanged."""
    async with httpx.AsyncClient(base_url=sim.admin_url) as admin:
        before = (await admin.get("/profile")).json()
        r = await admin.post("/profile", content=content)
        after = (await admin.get("/profile")).json()
    assert r.status_code == 422
    assert before == after
