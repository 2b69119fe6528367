"""The canary inside the composed gateway, in-process: split, header, rollback, admin, metrics."""

from __future__ import annotations

import httpx
import pytest

from ballast_asgi.config import load_config
from ballast_asgi.gateway import Gateway, build_gateway
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio
TOKEN = "s3cret"


class Versions:
    """Stable (stable.test) answers 200; canary (canary.test) fails ``canary_fail`` of calls.

    Each call moves the fake clock by ``step`` seconds.
    """

    def __init__(self, clock: FakeClock, canary_fail: int = 0, step: float = 0.05) -> None:
        self.clock = clock
        self.step = step
        self.canary_fail = canary_fail
        self.calls = {"stable.test": 0, "canary.test": 0, "canary2.test": 0}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.calls[host] += 1
        self.clock.advance(self.step)
        failing = host.startswith("canary") and self.canary_fail
        if failing and self.calls[host] % self.canary_fail == 0:
            return httpx.Response(500, json={"version": host})
        return httpx.Response(200, json={"version": host})


def _gateway(up: Versions, clock: FakeClock, canary: str = "", admin: str = "") -> Gateway:
    overrides = {"upstream": "http://stable.test", "admin": {"token": admin or None}}
    if canary:
        overrides["canary"] = {"upstream": "http://canary.test", "weight": 0.3}
    config = load_config(env={}, overrides=overrides)
    return build_gateway(config, transport=httpx.MockTransport(up), env={}, clock=clock)


def _client(gw: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(gw), base_url="http://gw")


async def test_responses_carry_the_version_that_served_them() -> None:
    """X-Ballast-Version names the upstream that answered; ~30 % go to the canary."""
    clock = FakeClock()
    up = Versions(clock)
    async with _client(_gateway(up, clock, canary="on")) as c:
        seen = []
        for i in range(200):
            r = await c.get("/x", headers={"X-Request-Id": f"r{i}"})
            host = r.json()["version"]
            seen.append(r.headers["x-ballast-version"])
            assert r.headers["x-ballast-version"] == host.removesuffix(".test")
    assert 35 <= seen.count("canary") <= 85


async def test_a_failing_canary_is_rolled_back_and_gets_no_more_traffic() -> None:
    """Every other canary request failing: rolled back on errors, then only stable serves."""
    clock = FakeClock()
    up = Versions(clock, canary_fail=2)
    gw = _gateway(up, clock, canary="on")
    assert gw.canary is not None
    async with _client(gw) as c:
        for i in range(400):
            await c.get("/x", headers={"X-Request-Id": f"r{i}"})
            if gw.canary.rollout.state.value == "rolled_back":
                break
        doc = (await c.get("/_ballast/canary")).json()
        assert doc["state"] == "rolled_back" and doc["weight"] == 0.0
        assert clock.now - 1000.0 < 15.0
        assert doc["decision"]["reason"] == "errors"
        assert doc["counts"]["canary"]["errors"] > 0
        before = up.calls["canary.test"]
        versions = {
            (await c.get("/x", headers={"X-Request-Id": f"after{i}"})).headers["x-ballast-version"]
            for i in range(50)
        }
    assert versions == {"stable"} and up.calls["canary.test"] == before


async def test_an_identical_canary_keeps_running() -> None:
    """Both versions healthy for a simulated minute: still running, counts on both sides."""
    clock = FakeClock()
    up = Versions(clock, step=0.2)
    async with _client(_gateway(up, clock, canary="on")) as c:
        for i in range(300):
            await c.get("/x", headers={"X-Request-Id": f"r{i}"})
        doc = (await c.get("/_ballast/canary")).json()
    assert doc["state"] == "running" and doc["counts"]["canary"]["requests"] > 50
    assert doc["statistic"]["errors"]["log_e_value"] <= 0.0


async def test_the_canary_can_be_a_pool() -> None:
    """canary.upstream as a list: both canary instances serve, labelled canary, judged as one."""
    clock = FakeClock()
    up = Versions(clock, canary_fail=2)
    overrides = {"upstream": "http://stable.test",
                 "canary": {"upstream": ["http://canary.test", "http://canary2.test"],
                            "weight": 0.3}}  # fmt: skip
    gw = build_gateway(load_config(env={}, overrides=overrides),
                       transport=httpx.MockTransport(up), env={}, clock=clock)  # fmt: skip
    async with _client(gw) as c:
        for i in range(400):
            r = await c.get("/x", headers={"X-Request-Id": f"r{i}"})
            assert r.headers["x-ballast-version"] == (
                "stable" if r.json()["version"] == "stable.test" else "canary"
            )
            if gw.canary is not None and gw.canary.rollout.state.value == "rolled_back":
                break
        doc = (await c.get("/_ballast/canary")).json()
    assert up.calls["canary.test"] > 0 and up.calls["canary2.test"] > 0
    assert doc["upstreams"] == ["http://canary.test", "http://canary2.test"]
    assert doc["state"] == "rolled_back" and doc["decision"]["reason"] == "errors"


async def test_no_canary_reports_none() -> None:
    """Without a canary section the endpoint says state none, and no header is added."""
    clock = FakeClock()
    async with _client(_gateway(Versions(clock), clock)) as c:
        assert (await c.get("/_ballast/canary")).json()["state"] == "none"
        assert "x-ballast-version" not in (await c.get("/x")).headers
        snap = (await c.get("/_ballast/snapshot")).json()
    assert snap["canary"] == {"state": "none"}


async def test_admin_actions_need_the_token() -> None:
    """promote/rollback: 404 without a token configured, 401 with a wrong one, 405 on GET."""
    clock = FakeClock()
    async with _client(_gateway(Versions(clock), clock, canary="on")) as c:
        assert (await c.post("/_ballast/canary/rollback")).status_code == 404
    async with _client(_gateway(Versions(clock), clock, canary="on", admin=TOKEN)) as c:
        bad = {"Authorization": "Bearer nope"}
        assert (await c.post("/_ballast/canary/rollback", headers=bad)).status_code == 401
        good = {"Authorization": f"Bearer {TOKEN}"}
        assert (await c.get("/_ballast/canary/rollback", headers=good)).status_code == 405
        r = await c.post("/_ballast/canary/rollback", headers=good)
        assert r.status_code == 200 and r.json()["state"] == "rolled_back"
        assert r.json()["decision"]["reason"] == "operator"
        again = await c.post("/_ballast/canary/promote", headers=good)
        assert again.status_code == 409 and again.json()["state"] == "rolled_back"


async def test_promote_makes_the_canary_the_stable_version() -> None:
    """After promotion every request goes to the canary's upstream, labelled stable."""
    clock = FakeClock()
    up = Versions(clock)
    async with _client(_gateway(up, clock, canary="on", admin=TOKEN)) as c:
        r = await c.post("/_ballast/canary/promote", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.json()["state"] == "promoted" and r.json()["weight"] == 1.0
        for i in range(20):
            resp = await c.get("/x", headers={"X-Request-Id": f"p{i}"})
            assert resp.json()["version"] == "canary.test"
            assert resp.headers["x-ballast-version"] == "stable"


async def test_metrics_per_version() -> None:
    """The scrape has per-version request counters, the weight and the state."""
    clock = FakeClock()
    async with _client(_gateway(Versions(clock, canary_fail=3), clock, canary="on")) as c:
        for i in range(50):
            await c.get("/x", headers={"X-Request-Id": f"m{i}"})
        text = (await c.get("/_ballast/metrics")).text
    assert 'ballast_canary_requests_total{result="ok",version="stable"}' in text
    assert 'ballast_canary_requests_total{result="error",version="canary"}' in text
    assert "ballast_canary_weight 0.3" in text
    assert 'ballast_canary_state{state="running"} 1.0' in text


async def test_canary_routes_follow_the_admin_placement() -> None:
    """admin.on_traffic_port false: /_ballast/canary is 404 there, /canary is on the admin port."""
    clock = FakeClock()
    overrides = {"upstream": "http://stable.test", "admin": {"on_traffic_port": False},
                 "canary": {"upstream": "http://canary.test"}}  # fmt: skip
    config = load_config(env={}, overrides=overrides)
    gw = build_gateway(config, transport=httpx.MockTransport(Versions(clock)), env={}, clock=clock)
    async with _client(gw) as c:
        assert (await c.get("/_ballast/canary")).status_code == 404
    admin = httpx.AsyncClient(transport=httpx.ASGITransport(gw.admin_app()), base_url="http://a")
    async with admin:
        doc = (await admin.get("/canary")).json()
    assert doc["state"] == "running" and doc["upstream"] == "http://canary.test"


async def test_the_gateway_learns_from_the_stable_history() -> None:
    """Stable errors spread evenly for 20 simulated s: the history reads calm, the cap is lifted."""
    clock = FakeClock()
    up = Versions(clock, step=0.05)
    history = {"history_ms": 10_000, "window_ms": 1000, "min_events": 10}
    overrides = {
        "upstream": "http://stable.test",
        "canary": {"upstream": "http://canary.test", "weight": 0.1,
                   "sequential": {"history": history}},
    }  # fmt: skip

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "stable.test" and up.calls["stable.test"] % 10 == 9:
            up.calls["stable.test"] += 1
            clock.advance(up.step)
            return httpx.Response(503, json={"version": "stable.test"})
        return up(request)

    config = load_config(env={}, overrides=overrides)
    gw = build_gateway(config, transport=httpx.MockTransport(handler), env={}, clock=clock)
    async with _client(gw) as c:
        for i in range(400):
            await c.get("/x", headers={"X-Request-Id": f"r{i}"})
        doc = (await c.get("/_ballast/canary")).json()
    learned = doc["statistic"]["stable_history"]
    assert learned["covered_s"] >= 10.0 and learned["instances"] == 1
    assert learned["errors"]["regime"] == "calm"
    assert doc["statistic"]["errors"]["cap_nats"] == 50.0
    assert doc["state"] == "running"
