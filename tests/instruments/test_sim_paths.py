"""Simulator path classes (issue 28 item 4): own workers and service time per path prefix."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest

from ballast_tools.upstream_sim.app import TrafficApp, build_admin_app
from ballast_tools.upstream_sim.model import PathClass, Profile, Simulator, path_class

pytestmark = pytest.mark.anyio

BASE = Profile(8, 0.025, 0.12)


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://sim")


def test_first_matching_prefix_wins() -> None:
    """A path uses the first class whose prefix it starts with; others the default pool."""
    prof = Profile(8, 0.025, 0.12, paths=(PathClass("/slow", 2, 1.0), PathClass("/s", 1, 0.5)))
    assert path_class(prof, "/slow/3") == 0
    assert path_class(prof, "/sx") == 1
    assert path_class(prof, "/fast") == -1


def test_a_saturated_class_does_not_queue_the_others() -> None:
    """Two requests on a 1-worker class queue one; a request on another class starts at once."""
    sim: Simulator[str] = Simulator(
        Profile(1, 0.01, 0.01, paths=(PathClass("/slow", 1, 1.0),)), random.Random(1)
    )
    assert sim.arrive("a", 0) is True
    assert sim.arrive("b", 0) is False
    assert sim.arrive("c", -1) is True
    service = sim.begin(0.0, None, 0.0, 0)
    assert service.duration_s == 1.0
    assert sim.end(service, None, 1.0, 0) == "b"
    snap = sim.snapshot()
    assert snap["busy"] == 2 and snap["queue_len"] == 0


def test_class_resize_starts_queued_requests() -> None:
    """Growing a class's workers live starts its queued requests, reported with their class."""
    sim: Simulator[str] = Simulator(
        Profile(1, 0.01, 0.01, paths=(PathClass("/slow", 1, 1.0),)), random.Random(1)
    )
    sim.arrive("a", 0)
    sim.arrive("b", 0)
    started = sim.set_profile_classes(Profile(1, 0.01, 0.01, paths=(PathClass("/slow", 2, 1.0),)))
    assert started == [("b", 0)]


@pytest.mark.parametrize(
    "bad",
    [
        [{"prefix": "slow", "workers": 1, "service": "1s"}],
        [{"prefix": "/slow", "workers": 0, "service": "1s"}],
        [{"prefix": "/slow", "workers": 1, "service": "11s"}],
        [{"prefix": "/slow", "workers": 1, "service": 25}],
        [{"prefix": "/" + "x" * 70, "workers": 1, "service": "1s"}],
        [{"prefix": "/a b", "workers": 1, "service": "1s"}],
        [{"prefix": "/slow", "workers": 1, "service": "1s", "extra": 1}],
        [{"prefix": f"/p{i}", "workers": 1, "service": "1ms"} for i in range(17)],
        "not a list",
    ],
)
async def test_post_profile_rejects_bad_paths_by_name(bad: Any) -> None:
    """A malformed, huge or hostile paths list gets 422 naming paths; the profile is unchanged."""
    app = TrafficApp(Simulator(BASE, random.Random(1)))
    async with _client(build_admin_app(app)) as c:
        r = await c.post("/profile", json={"paths": bad})
    assert r.status_code == 422
    assert all(f["field"].startswith("paths") for f in r.json()["fields"])
    assert app.sim.profile == BASE


async def test_post_profile_sets_classes_live_and_keeps_the_pinned_keys() -> None:
    """paths is set and read back; the pinned keys (workers, fast, slow...) work as before."""
    app = TrafficApp(Simulator(BASE, random.Random(1)))
    classes = [
        {"prefix": "/fast", "workers": 1, "service": "2ms"},
        {"prefix": "/slow", "workers": 9, "service": "1s"},
    ]
    async with _client(build_admin_app(app)) as c:
        r = await c.post("/profile", json={"paths": classes, "workers": 4, "fast": "30ms"})
        got = (await c.get("/profile")).json()
        cleared = (await c.post("/profile", json={"paths": []})).json()
    assert r.status_code == 200
    assert got["workers"] == 4 and got["fast"] == "30ms" and got["slow"] == "120ms"
    assert [(p["prefix"], p["workers"], p["service"]) for p in got["paths"]] == [
        ("/fast", 1, "2ms"),
        ("/slow", 9, "1s"),
    ]
    assert got["paths"][1]["capacity_rps"] == 9.0
    assert cleared["paths"] == []


async def test_traffic_on_a_class_takes_its_service_time() -> None:
    """A request on /slow holds one of the class's workers for its service time."""
    prof = Profile(2, 0.0, 0.0, paths=(PathClass("/slow", 1, 3600.0),))
    app = TrafficApp(Simulator(prof, random.Random(1)))

    async def call(path: str) -> None:
        scope = {"type": "http", "headers": [], "path": path}
        await app(scope, _never, _discard)

    slow = asyncio.create_task(call("/slow/1"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert app.sim.class_pools[0].busy == 1 and app.sim.pool.busy == 0
    async with _client(app) as c:
        assert (await c.get("/fast")).status_code == 200
    slow.cancel()
    await asyncio.gather(slow, return_exceptions=True)
    assert app.sim.class_pools[0].busy == 0


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {}


async def _discard(message: dict[str, Any]) -> None:
    return None


def test_cli_parses_path_classes_and_rejects_bad_ones() -> None:
    """--paths builds the classes; a malformed item is a usage error naming it."""
    import argparse

    from ballast_tools.upstream_sim.__main__ import _paths

    assert _paths("/fast=1x2ms,/slow=9x1s") == (
        PathClass("/fast", 1, 0.002),
        PathClass("/slow", 9, 1.0),
    )
    for bad in ("/fast", "/fast=2ms", "fast=1x2ms", "/fast=0x2ms", "/fast=1xsoon"):
        with pytest.raises(argparse.ArgumentTypeError, match="--paths"):
            _paths(bad)
