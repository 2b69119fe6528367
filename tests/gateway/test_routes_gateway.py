"""Routes in the composed gateway: one match per request, per-route policy, bounded state."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import ballast_asgi
from ballast_asgi.config import build_config, load_config
from ballast_asgi.gateway import Gateway, build_gateway
from ballast_asgi.gateway.stack import build_parts, build_stack
from ballast_asgi.middleware.context import find_context
from ballast_asgi.telemetry.events import LOGGER, events
from ballast_asgi.telemetry.metrics import null_metrics
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio

Handler = Callable[[httpx.Request], httpx.Response]


class Upstream:
    """``/status/N`` answers N, ``/refused/*`` refuses the connection, the rest 200."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.calls.append(path)
        if path.startswith("/refused"):
            raise httpx.ConnectError("connection refused")
        if path.startswith("/status/"):
            return httpx.Response(int(path.split("/")[2]), json={"path": path})
        return httpx.Response(
            200, json={"path": path, "priority": request.headers.get("x-priority")}
        )


def _gateway(up: Handler, data: dict[str, Any] | None = None) -> Gateway:
    config = build_config({"upstream": "http://up.test", **(data or {})})
    return build_gateway(config, transport=httpx.MockTransport(up), env={})


def _client(gw: Gateway, ip: str = "10.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(gw, client=(ip, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://gw")


async def test_one_client_failing_forty_times_costs_another_client_nothing() -> None:
    """40 failing requests from one address: another address is never shed, on any path."""
    up = Upstream()
    gw = _gateway(up)
    async with _client(gw, "10.0.0.1") as bad:
        answers = [(await bad.get("/status/500")).status_code for _ in range(40)]
    assert answers == [500] * 40
    async with _client(gw, "10.0.0.2") as good:
        other = [await good.get(p) for p in ("/get", "/status/500", "/status/200")]
    assert [r.status_code for r in other] == [200, 500, 200]
    assert all("x-ballast-reason" not in r.headers for r in other)
    snap = gw.snapshot()
    assert snap["routes"]["/status"]["breaker"]["state"] == "closed"
    assert snap["shed"] == {}


async def test_a_real_outage_from_five_addresses_opens_the_breaker_with_503() -> None:
    """Connection refused for five clients: the breaker opens; sheds are 503 breaker_open."""
    up = Upstream()
    gw = _gateway(up)
    seen: list[httpx.Response] = []
    for i in range(5):
        async with _client(gw, f"10.0.1.{i}") as c:
            seen.extend([await c.get("/refused/x") for _ in range(4)])
    assert {r.status_code for r in seen[:3]} == {502}
    shed = [r for r in seen if r.headers.get("x-ballast-reason") == "breaker_open"]
    assert shed and all(r.status_code == 503 for r in shed)
    assert all(int(r.headers["retry-after"]) >= 1 for r in shed)
    routes = gw.snapshot()["routes"]  # never answered: no route of its own, on "other"
    assert "/refused" not in routes and routes["other"]["breaker"]["state"] == "open"


async def test_500s_from_three_addresses_open_only_that_route() -> None:
    """A 500 outage reported by several addresses opens /status; /get keeps being served."""
    up = Upstream()
    gw = _gateway(up)
    for i in range(12):
        async with _client(gw, f"10.0.2.{i % 3}") as c:
            await c.get("/status/500")
    async with _client(gw, "10.0.2.9") as c:
        failing = await c.get("/status/500")
        healthy = await c.get("/get")
    assert failing.status_code == 503 and failing.headers["x-ballast-reason"] == "breaker_open"
    assert healthy.status_code == 200


async def test_4xx_never_counts_towards_opening() -> None:
    """Hundreds of 404s and 429s from many addresses leave the breaker closed."""
    up = Upstream()
    gw = _gateway(up)
    for i in range(200):
        async with _client(gw, f"10.0.3.{i % 7}") as c:
            assert (await c.get(f"/status/{404 if i % 2 else 429}")).status_code in (404, 429)
    assert gw.snapshot()["routes"]["/status"]["breaker"]["state"] == "closed"


async def test_thousands_of_random_paths_keep_snapshot_and_metrics_bounded() -> None:
    """3,000 invented paths: routes in the snapshot and route labels stay <= max_groups + 2."""
    up = Upstream()
    gw = _gateway(up, {"auto_routes": {"max_groups": 16}})
    rng = random.Random(3)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_."
    segments = ["".join(rng.choices(alphabet, k=rng.randint(1, 30))) for _ in range(300)]
    async with _client(gw) as c:
        for _ in range(3_000):  # an upstream answering 200 to anything: every segment "known"
            await c.get(f"/{rng.choice(segments)}/{rng.randint(0, 10**9)}")
        text = (await c.get("/_ballast/metrics")).text
    assert len(gw.snapshot()["routes"]) <= 16 + 1
    labels = {
        s.labels["route"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "route" in s.labels
    }
    assert 1 < len(labels) <= 16 + 1
    assert len(gw.parts.breakers.items()) <= 16 + 1


async def test_configured_route_sets_priority_deadline_and_is_on_the_context() -> None:
    """A route's priority and deadline are the defaults of its requests; ctx.route names it."""
    seen: list[Any] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        ctx = find_context(scope)
        seen.append((ctx.route, ctx.priority, ctx.remaining_ms()) if ctx else None)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    config = build_config(
        {
            "routes": [
                {"name": "batch", "path": ["/batch", "/batch/*"], "priority": "bulk",
                 "deadline_ms": 250, "limiter": {"partition": True}},
            ],
        },
        require_upstream=False,
    )  # fmt: skip
    parts = build_parts(config, null_metrics())
    app = build_stack(inner, parts, config, retries=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://a") as c:
        await c.get("/batch/nightly")
        await c.get("/batch/x", headers={"X-Priority": "critical", "X-Deadline-Ms": "5000"})
        await c.get("/plain")
    (r1, p1, left1), (r2, p2, left2), (r3, p3, left3) = seen
    assert r1.name == "batch" and r1.limiter_partition and p1.label == "bulk"
    assert 0 < left1 <= 250
    assert r2 is r1 and p2.label == "critical" and left2 > 250  # headers win over route defaults
    assert r3.name == "other" and not r3.limiter_partition and p3.label == "standard"
    assert left3 is None


async def test_route_breaker_overrides_apply_to_that_route_only() -> None:
    """A route with breaker overrides (1 client, 2 failures) opens alone, after 2 failures."""
    up = Upstream()
    strict = {"name": "strict", "path": "/status/503*", "breaker": {"min_failing_clients": 1,
              "consecutive_failures": 2}, "retry": {"max_attempts": 1}}  # fmt: skip
    gw = _gateway(up, {"routes": [strict]})
    async with _client(gw) as c:
        first = [(await c.get("/status/503")).status_code for _ in range(3)]
        other = [(await c.get("/status/500")).status_code for _ in range(15)]
    assert first == [503, 503, 503]
    assert up.calls.count("/status/503") == 2  # one attempt each (retry override), then open
    assert other == [500] * 15
    routes = gw.snapshot()["routes"]
    assert routes["strict"]["breaker"]["state"] == "open"
    assert routes["/status"]["breaker"]["state"] == "closed"


async def test_route_rate_limit_applies_without_the_section() -> None:
    """routes[].rate_limit limits that route per client while rate_limit.enabled is false."""
    up = Upstream()
    gw = _gateway(up, {"routes": [{"name": "login", "path": "/login", "rate_limit": {
        "rate_per_s": 0.001, "burst": 2}}]})  # fmt: skip
    async with _client(gw) as c:
        statuses = [(await c.get("/login")).status_code for _ in range(4)]
        free = [(await c.get("/get")).status_code for _ in range(4)]
    assert statuses == [200, 200, 429, 429]
    assert free == [200] * 4


async def test_status_by_reason_is_configurable_and_reloadable(tmp_path: Path) -> None:
    """shed.status_by_reason sets a reason's status; a reload changes it live."""
    up = Upstream()
    path = tmp_path / "b.yaml"
    path.write_text("upstream: http://up.test\nshed:\n  status_by_reason: {deadline: 504}\n")

    gw = build_gateway(load_config(env={}, path=path), transport=httpx.MockTransport(up),
                       config_path=path, env={})  # fmt: skip
    async with _client(gw) as c:
        assert (await c.get("/x", headers={"X-Deadline-Ms": "0"})).status_code == 504
        path.write_text("upstream: http://up.test\n")
        assert (await gw.reload())[0]
        assert (await c.get("/x", headers={"X-Deadline-Ms": "0"})).status_code == 429


async def test_snapshot_routes_are_keyed_by_name_with_breaker_and_counts() -> None:
    """/_ballast/snapshot has routes keyed by name: source, requests, breaker state."""
    up = Upstream()
    gw = _gateway(up, {"routes": [{"name": "api", "path": "/api/*"}]})
    async with _client(gw) as c:
        await c.get("/api/a")
        await c.get("/get")  # route other; the 200 gives /get its route
        await c.get("/get")
        snap = (await c.get("/_ballast/snapshot")).json()
    api = snap["routes"]["api"]
    assert api["source"] == "config" and api["requests"] == 1 and api["paths"] == ["/api/*"]
    assert api["breaker"]["state"] == "closed"
    assert snap["routes"]["/get"]["source"] == "auto" and snap["routes"]["/get"]["requests"] == 1
    assert snap["routes"]["other"]["requests"] == 1


async def test_in_an_app_the_route_is_the_template_and_handlers_can_read_it() -> None:
    """install(): ctx.route.name is the matched route template; unknown paths are grouped."""
    app = FastAPI()

    @app.get("/items/{item_id}")
    async def item(item_id: str, request: Request) -> dict[str, str]:
        return {"route": request.state.ballast.route.name}

    handle = ballast_asgi.install(app, registry=CollectorRegistry())
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        named = await c.get("/items/42")
        missing = await c.get("/nothing/here")
    assert named.json() == {"route": "/items/{item_id}"}
    assert missing.status_code == 404
    routes = handle.snapshot()["routes"]
    assert routes["/items/{item_id}"]["source"] == "app"
    assert routes["other"]["requests"] == 1 and "/nothing" not in routes  # a 404 learns nothing


async def test_forged_forwarded_for_cannot_make_one_address_look_like_many() -> None:
    """An untrusted peer rotating X-Forwarded-For is still one client: the breaker stays closed."""
    up = Upstream()
    gw = _gateway(up)
    async with _client(gw, "10.0.5.1") as c:
        for i in range(60):
            r = await c.get("/status/500", headers={"X-Forwarded-For": f"198.51.100.{i}"})
            assert r.status_code == 500
    assert gw.snapshot()["routes"]["/status"]["breaker"]["failing_clients"] == 1


async def test_clients_behind_a_trusted_proxy_count_as_distinct() -> None:
    """Behind proxy.trusted_proxies the forwarded client decides: five of them open it."""
    up = Upstream()
    gw = _gateway(up, {"proxy": {"trusted_proxies": ["10.9.0.0/16"]}})
    async with _client(gw, "10.9.0.1") as c:
        seen = [
            await c.get("/status/500", headers={"X-Forwarded-For": f"198.51.100.{i % 5}"})
            for i in range(20)
        ]
    assert seen[-1].status_code == 503
    assert seen[-1].headers["x-ballast-reason"] == "breaker_open"


async def test_a_reload_adds_a_route_and_keeps_counting(tmp_path: Path) -> None:
    """Reloading with a new route: its requests go there; route counts are not reset."""
    up = Upstream()
    path = tmp_path / "b.yaml"
    path.write_text("upstream: http://up.test\n")
    gw = build_gateway(load_config(env={}, path=path), transport=httpx.MockTransport(up),
                       config_path=path, env={})  # fmt: skip
    async with _client(gw) as c:
        await c.get("/api/a")
        path.write_text("upstream: http://up.test\nroutes:\n  - {name: api, path: /api/*}\n")
        assert (await gw.reload())[0]
        await c.get("/api/b")
        path.write_text("upstream: http://up.test\nroutes:\n  - {name: other, path: /x}\n")
        ok, message = await gw.reload()
    routes = gw.snapshot()["routes"]
    assert routes["api"]["requests"] == 1 and "/api" not in routes  # the new table's routes
    assert gw.parts.route_table().counts["other"] == 1  # ballast_route_requests_total goes on
    assert not ok and "routes.0.name" in message  # 'other' is reserved; nothing applied


async def test_invented_paths_do_not_take_routes_from_real_endpoints() -> None:
    """2,000 invented segments the upstream 404s first; /get and /status still get routes."""

    def known_only(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.startswith("/status/"):
            return httpx.Response(int(path.split("/")[2]))
        return httpx.Response(200 if path.startswith("/get") else 404)

    gw = _gateway(known_only, {"auto_routes": {"max_groups": 4}})
    rng = random.Random(5)
    async with _client(gw, "10.0.6.1") as c:
        for _ in range(2_000):
            seg = "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=10))
            assert (await c.get(f"/{seg}/x")).status_code == 404
        for path in ("/get", "/get", "/status/500", "/status/500"):
            await c.get(path)
    routes = gw.snapshot()["routes"]
    assert set(routes) == {"/get", "/status", "other"}
    assert routes["/get"]["requests"] == 1 and routes["/status"]["requests"] == 1


async def test_after_an_outage_one_failing_client_cannot_keep_the_route_shut() -> None:
    """Half-open: the bad client's failing probe does not reopen; the good client's closes it."""
    clock = FakeClock()
    up = Upstream()
    config = build_config({"upstream": "http://up.test", "retry": {"enabled": False}})
    gw = build_gateway(config, transport=httpx.MockTransport(up), env={}, clock=clock)
    for i in range(12):  # a real 5xx outage seen by three addresses
        async with _client(gw, f"10.0.7.{i % 3}") as c:
            await c.get("/status/503")
    assert gw.snapshot()["routes"]["/status"]["breaker"]["state"] == "open"
    clock.advance(2.5)  # open_ms 2 s: half-open, the upstream has recovered
    async with _client(gw, "10.0.7.66") as bad, _client(gw, "10.0.7.77") as good:
        probe = await bad.get("/status/500")  # bad's own requests keep failing
        again = await bad.get("/status/500")
        served = await good.get("/status/200")
        after = await bad.get("/status/500")
    assert probe.status_code == 500
    assert again.status_code == 503 and again.headers["x-ballast-reason"] == "breaker_open"
    assert served.status_code == 200
    assert after.status_code == 500 and "x-ballast-reason" not in after.headers  # closed
    assert gw.snapshot()["routes"]["/status"]["breaker"]["state"] == "closed"


async def test_a_route_breaker_opening_is_logged_with_its_route_and_makes_health_degraded(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """breaker.open names the route; /health is degraded naming the open routes."""
    log = logging.getLogger(LOGGER)
    saved = (log.propagate, log.level, list(log.handlers))
    log.propagate, log.handlers = True, []
    events.reset()
    caplog.set_level(logging.INFO, logger=LOGGER)
    try:
        up = Upstream()
        gw = _gateway(up)
        async with _client(gw) as c:
            assert (await c.get("/get")).status_code == 200  # /get: a route of its own
            for _ in range(6):
                await c.get("/refused/x")  # never answered: on "other"; connect errors
            assert gw.health() == (
                200,
                {"status": "degraded", "reasons": ["breaker: open on routes other (those "
                                                   "routes are shed)"]},
            )  # fmt: skip
            assert (await c.get("/get")).status_code == 200
    finally:
        log.propagate, log.level, log.handlers = saved
    opened = [r for r in caplog.records if getattr(r, "ballast_event", "") == "breaker.open"]
    assert [r.ballast_fields["route"] for r in opened] == ["other"]  # type: ignore[attr-defined]
