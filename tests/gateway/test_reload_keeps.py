"""A reload that changes unrelated keys keeps every configured behaviour (ADR 0019, issue 29).

One test per capability: each builds a gateway from a YAML file, changes
``limiter.window_ms`` and ``breaker.open_ms`` only, reloads, and checks that
what the capability configured still holds, both in the live parts and in
the chain requests actually run through (the stack is rebuilt whole; nothing
is patched afterwards).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from ballast_asgi.config import load_config
from ballast_asgi.core.breaker_set import BreakerSet
from ballast_asgi.core.outcome import Outcome
from ballast_asgi.discovery.core.model import ConfigVersion, Instance
from ballast_asgi.gateway import Gateway
from ballast_asgi.upstreams.core.limit import PoolLimit
from tests.e2e.support import free_port

pytestmark = pytest.mark.anyio
BEFORE = "limiter: {window_ms: 500}\nbreaker: {open_ms: 2000}\n"
AFTER = "limiter: {window_ms: 700}\nbreaker: {open_ms: 3000}\n"
NO_PROBES = "upstreams: {per_instance_limit: true, health_check: {enabled: false}}\n"


def _ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"host": request.url.host})


def _gateway(tmp_path: Path, head: str, handler: Any = _ok) -> tuple[Gateway, Path]:
    path = tmp_path / "gw.yaml"
    path.write_text(head + BEFORE)
    config = load_config(env={}, path=path)
    gw = Gateway(config, config_path=path, env={}, transport=httpx.MockTransport(handler))
    return gw, path


def _write(path: Path, text: str) -> None:
    path.write_text(text)


async def _reload(gw: Gateway, path: Path, head: str) -> None:
    _write(path, head + AFTER)
    ok, message = await gw.reload()
    assert ok, message
    assert gw.parts.breaker.open_s == 3.0 and gw.config.limiter.window_ms == 700


def _chain_breakers(gw: Gateway) -> BreakerSet:
    """The breaker set of the breaker stage requests run through now."""
    app: Any = gw.stack.direct
    while not hasattr(app, "stages"):
        app = app.app
    breakers: BreakerSet = app.stages.breaker.stage.breakers
    return breakers


def _client(gw: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(gw), base_url="http://gw")


async def test_discovery_pool_keeps_pool_limit_and_scaled_breaker(tmp_path: Path) -> None:
    """Discovery + two instances + per_instance_limit: a reload keeps PoolLimit and 20."""
    etcd = f"http://127.0.0.1:{free_port()}"
    head = f"discovery: {{etcd: {{endpoints: [{etcd}]}}, service: api}}\n" + NO_PROBES
    gw, path = _gateway(tmp_path, head)
    assert gw.discovery is not None
    a, b = Instance("http://a.test:81"), Instance("http://b.test:82")
    assert gw.discovery.follower.offer(ConfigVersion(1, (a, b)).encode())
    await _reload(gw, path, head)
    async with _client(gw) as c:  # 40 draws: both instances unless chance picks one 40 times
        hosts = {(await c.get("/x")).json()["host"] for _ in range(40)}
    await gw.discovery.stop()
    assert isinstance(gw.parts.limiter.algorithm, PoolLimit)
    assert gw.parts.breaker.consecutive_failures == 20
    assert hosts == {"a.test", "b.test"}


async def test_a_discovery_version_rescales_the_breakers_requests_use(tmp_path: Path) -> None:
    """A version that changes the instance count rebuilds the stack: the chain's breakers
    are the scaled ones the snapshot shows (before: the chain kept the unscaled set)."""
    etcd = f"http://127.0.0.1:{free_port()}"
    head = f"discovery: {{etcd: {{endpoints: [{etcd}]}}, service: api}}\n" + NO_PROBES
    gw, _ = _gateway(tmp_path, head)
    assert gw.discovery is not None
    versions = (Instance("http://a.test:81"), Instance("http://b.test:82"))
    assert gw.discovery.follower.offer(ConfigVersion(1, versions).encode())
    await gw.discovery.stop()
    assert _chain_breakers(gw) is gw.parts.breakers
    assert _chain_breakers(gw).default.consecutive_failures == 20


async def test_pool_keeps_instances_state_limits_and_breaker(tmp_path: Path) -> None:
    """A pool of three: the same instances (their state), PoolLimit and 30 after a reload."""
    head = "upstream: [http://a.test, http://b.test, http://c.test]\n" + NO_PROBES
    gw, path = _gateway(tmp_path, head)
    assert gw.pool is not None
    before = list(gw.pool.pool.instances)
    await _reload(gw, path, head)
    assert list(gw.pool.pool.instances) == before
    assert all(x is y for x, y in zip(gw.pool.pool.instances, before, strict=True))
    assert isinstance(gw.parts.limiter.algorithm, PoolLimit)
    assert _chain_breakers(gw).default.consecutive_failures == 30
    async with _client(gw) as c:
        hosts = {(await c.get("/x")).json()["host"] for _ in range(60)}
    assert hosts == {"a.test", "b.test", "c.test"}


async def test_canary_keeps_its_rollout_and_split(tmp_path: Path) -> None:
    """The canary's rollout and selector survive; responses still carry the version."""
    head = "upstream: http://stable.test\ncanary: {upstream: http://canary.test, weight: 0.5}\n"
    gw, path = _gateway(tmp_path, head)
    canary = gw.canary
    assert canary is not None
    await _reload(gw, path, head)
    assert gw.canary is canary and gw.proxy_app.selector is canary.selector
    async with _client(gw) as c:
        versions = {(await c.get("/x")).headers["x-ballast-version"] for _ in range(40)}
    assert versions == {"stable", "canary"}


async def test_rate_limits_keep_their_state(tmp_path: Path) -> None:
    """A consumer that used its burst before the reload is still limited after it."""
    head = (
        "upstream: http://one.test\n"
        "rate_limit: {enabled: true, rate_per_s: 0.001, burst: 2, key: consumer}\n"
    )
    gw, path = _gateway(tmp_path, head)
    limiter = gw.parts.ratelimit.limiter if gw.parts.ratelimit else None
    key = {"x-api-key": "k1"}
    async with _client(gw) as c:
        first = [(await c.get("/x", headers=key)).status_code for _ in range(2)]
        await _reload(gw, path, head)
        after = (await c.get("/x", headers=key)).status_code
    assert gw.parts.ratelimit is not None and gw.parts.ratelimit.limiter is limiter
    assert first == [200, 200] and after == 429


async def test_routes_keep_their_breakers_and_counts(tmp_path: Path) -> None:
    """A route's own breaker settings and its request count survive a reload."""
    head = (
        "upstream: http://one.test\nbreaker: {scope: route}\n"
        "routes: [{name: api, path: /api/*, breaker: {consecutive_failures: 5}}]\n"
    )
    path = tmp_path / "gw.yaml"
    _write(path, head + "limiter: {window_ms: 500}\n")
    gw = Gateway(load_config(env={}, path=path), config_path=path, env={},
                 transport=httpx.MockTransport(_ok))  # fmt: skip
    async with _client(gw) as c:
        await c.get("/api/a")
        _write(path, head + "limiter: {window_ms: 700}\n")
        ok, message = await gw.reload()
        await c.get("/api/b")
    assert ok, message
    assert _chain_breakers(gw) is gw.parts.breakers
    assert gw.parts.breakers.get("api").consecutive_failures == 5
    assert gw.parts.route_table().counts["api"] == 2


async def test_limiter_queue_and_capacity_keep_permits_and_caps(tmp_path: Path) -> None:
    """The same limiter, queue and capacity (permits, waiters) with their caps after a reload."""
    head = (
        "upstream: http://one.test\nmax_concurrent_requests: 7\n"
        "admission_queue: {max_queue_size: 11}\ncapacity: {max_held_requests: 13}\n"
    )
    gw, path = _gateway(tmp_path, head)
    limiter, queue, capacity = gw.parts.limiter, gw.parts.queue, gw.parts.capacity
    permit = limiter.try_acquire(0.0)
    await _reload(gw, path, head)
    assert permit is not None and limiter.inflight == 1
    permit.release(Outcome.SUCCESS, 1.0)
    assert gw.parts.limiter is limiter and limiter.inflight == 0 and limiter.max_limit == 7
    assert gw.parts.queue is queue and queue.max_size == 11
    assert gw.parts.capacity is capacity and capacity is not None
    assert capacity.max_held == 13


async def test_websocket_limits_survive(tmp_path: Path) -> None:
    """The WebSocket caps (and the relay holding the open connections) survive a reload."""
    head = "upstream: http://one.test\nwebsocket: {max_connections: 3}\n"
    gw, path = _gateway(tmp_path, head)
    relay = gw.websockets
    await _reload(gw, path, head)
    assert gw.websockets is relay and relay.cap.max_connections == 3


async def test_install_reload_keeps_route_breakers_and_limits() -> None:
    """install(): a reload of unrelated keys keeps the limiter, its cap and the breakers."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def ok(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/a", ok)])
    from ballast_asgi.gateway.embed import install

    cfg = {"max_concurrent_requests": 9, "breaker": {"consecutive_failures": 4}}
    handle = install(app, {**cfg, "limiter": {"window_ms": 500}})
    limiter = handle.parts.limiter
    handle.reload({**cfg, "limiter": {"window_ms": 700}})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://a") as c:
        r = await c.get("/a")
    assert r.status_code == 200
    assert handle.parts.limiter is limiter and limiter.max_limit == 9
    assert handle.parts.breaker.consecutive_failures == 4
