"""The simulator's ASGI apps in process: traffic responses, worker hand-over, admin API."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import anyio.lowlevel
import httpx
import pytest

from ballast_tools.upstream_sim.app import TrafficApp, build_admin_app
from ballast_tools.upstream_sim.model import Profile, Simulator
from ballast_tools.upstream_sim.profile_api import ProfileUpdate, apply_update

pytestmark = pytest.mark.anyio

INSTANT = Profile(workers=2, fast_s=0.0, slow_s=0.0)
FOREVER = Profile(workers=1, fast_s=3600.0, slow_s=3600.0)


def _traffic(profile: Profile) -> TrafficApp:
    return TrafficApp(Simulator(profile, random.Random(1)))


def _client(app: Any, base: str = "http://sim") -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=base)


async def test_traffic_answers_200_with_a_small_body() -> None:
    """A request on any path is served with a few bytes."""
    async with _client(_traffic(INSTANT)) as c:
        r = await c.get("/anything", headers={"X-Deadline-Ms": "400"})
    assert r.status_code == 200 and r.content == b"ok\n"


async def test_error_rate_one_answers_the_error_status() -> None:
    """error_rate=1 answers every request with error_status."""
    app = _traffic(Profile(2, 0.0, 0.0, error_rate=1.0, error_status=503))
    async with _client(app) as c:
        r = await c.get("/")
    assert r.status_code == 503
    assert app.sim.stats.errored == 1


async def test_cancelled_waiters_release_their_place_and_workers() -> None:
    """Cancelling a queued and an in-service request leaves no worker busy."""
    app = _traffic(FOREVER)

    async def call() -> None:
        scope = {"type": "http", "headers": []}
        await app(scope, _never_receive, _discard)

    first = asyncio.create_task(call())
    second = asyncio.create_task(call())
    for _ in range(3):
        await anyio.lowlevel.checkpoint()  # let both tasks reach their await points
    assert app.sim.pool.busy == 1 and app.sim.pool.queue_len == 1
    second.cancel()
    first.cancel()
    await asyncio.gather(first, second, return_exceptions=True)
    assert app.sim.pool.busy == 0 and app.sim.pool.queue_len == 0


async def test_hand_over_skips_a_cancelled_waiter() -> None:
    """A freed worker passes over a waiter whose future was cancelled."""
    app = _traffic(Profile(1, 0.0, 0.0))
    loop = asyncio.get_running_loop()
    gone, live = loop.create_future(), loop.create_future()
    app.sim.arrive(loop.create_future())
    app.sim.arrive(gone)
    app.sim.arrive(live)
    gone.cancel()
    app.hand_over(app.sim.release())
    assert live.done() and app.sim.pool.busy == 1 and app.sim.pool.queue_len == 0


async def _never_receive() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}


async def _discard(message: dict[str, Any]) -> None:
    return None


async def test_post_profile_changes_the_profile_partially() -> None:
    """POST /profile replaces only the fields given and returns the new profile."""
    app = _traffic(Profile(8, 0.025, 0.12))
    async with _client(build_admin_app(app)) as c:
        r = await c.post("/profile", json={"workers": 16, "fast": "30ms", "latency_multiplier": 5})
        got = (await c.get("/profile")).json()
    assert r.status_code == 200
    assert got["workers"] == 16 and got["fast"] == "30ms" and got["slow"] == "120ms"
    assert got["latency_multiplier"] == 5 and app.sim.pool.workers == 16


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"workers": 0}, "workers"),
        ({"fast": "fast"}, "fast"),
        ({"fast": 25}, "fast"),
        ({"slow_fraction": 2}, "slow_fraction"),
        ({"latency_multiplier": 0}, "latency_multiplier"),
        ({"worker": 8}, "worker"),
    ],
)
async def test_post_profile_rejects_bad_fields_by_name(body: dict[str, Any], field: str) -> None:
    """An invalid field gets 422 naming it, and the profile is unchanged."""
    app = _traffic(Profile(8, 0.025, 0.12))
    async with _client(build_admin_app(app)) as c:
        r = await c.post("/profile", json=body)
    assert r.status_code == 422
    assert [f["field"] for f in r.json()["fields"]] == [field]
    assert app.sim.profile == Profile(8, 0.025, 0.12)


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]"])
async def test_post_profile_rejects_non_objects_with_400(content: bytes) -> None:
    """A body that is not a JSON object gets 400."""
    async with _client(build_admin_app(_traffic(INSTANT))) as c:
        r = await c.post("/profile", content=content)
    assert r.status_code == 400 and "error" in r.json()


async def test_stats_and_reset() -> None:
    """GET /stats reports counters and live state; POST /stats/reset zeroes them."""
    traffic = _traffic(INSTANT)
    async with _client(traffic) as t, _client(build_admin_app(traffic)) as admin:
        await t.get("/")
        stats = (await admin.get("/stats")).json()
        reset = (await admin.post("/stats/reset")).json()
    assert stats["served"] == 1 and stats["workers"] == 2 and "cpu_s" in stats
    assert stats["queue_wait_ms"]["count"] == 1
    assert reset["served"] == 0


def test_apply_update_reads_durations_in_every_form() -> None:
    """'25ms', '1.5s', '250us' and bare seconds all parse to seconds."""
    base = Profile(8, 0.025, 0.12)
    for raw, seconds in [("25ms", 0.025), ("1.5s", 1.5), ("250us", 0.00025), (0.2, 0.2)]:
        p = apply_update(base, ProfileUpdate.model_validate({"slow": raw}))
        assert p.slow_s == pytest.approx(seconds)
