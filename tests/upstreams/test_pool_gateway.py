"""The gateway over a pool, in process: spread, retries elsewhere, ejection, snapshot, reload."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest
from anyio.lowlevel import checkpoint
from prometheus_client.parser import text_string_to_metric_families

from ballast_asgi.config import load_config
from ballast_asgi.gateway import Gateway, build_gateway

pytestmark = pytest.mark.anyio

HOSTS = ["a.test", "b.test", "c.test"]
NO_PROBES = "upstreams:\n  health_check:\n    enabled: false\n"


class Instances:
    """A MockTransport handler playing several instances, by host."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.mode: dict[str, str] = {}
        self.gate: asyncio.Event | None = None

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.calls[host] += 1
        mode = self.mode.get(host, "ok")
        if mode == "refuse":
            raise httpx.ConnectError("refused", request=request)
        if mode == "hold" and self.gate is not None:
            await self.gate.wait()
        if mode == "503":
            return httpx.Response(503, text="unavailable")
        return httpx.Response(200, json={"host": host})


def _gateway(inst: Instances, tmp_path: Path, hosts: list[str] = HOSTS, extra: str = "") -> Gateway:
    path = tmp_path / "ballast.yaml"
    _write(path, hosts, NO_PROBES + extra)
    config = load_config(env={}, path=path)
    return build_gateway(config, transport=httpx.MockTransport(inst), config_path=path, env={})


def _write(path: Path, hosts: list[str], extra: str) -> None:
    items = "".join(f"  - http://{h}\n" for h in hosts)
    path.write_text(f"upstream:\n{items}admin:\n  token: t\n{extra}")


def _client(gw: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(gw), base_url="http://gw")


async def test_spreads_over_instances(tmp_path: Path) -> None:
    """Sequential requests reach every instance in fair shares."""
    inst = Instances()
    async with _client(_gateway(inst, tmp_path)) as c:
        for _ in range(300):
            assert (await c.get("/x")).status_code == 200
    assert set(inst.calls) == set(HOSTS) and min(inst.calls.values()) >= 70


@pytest.mark.parametrize("mode", ["503", "refuse"])
async def test_broken_instance_is_retried_elsewhere_and_ejected(tmp_path: Path, mode: str) -> None:
    """Clients see no failure from one broken instance; it is ejected after a few attempts."""
    inst = Instances()
    inst.mode["a.test"] = mode
    gw = _gateway(inst, tmp_path)
    async with _client(gw) as c:
        statuses = Counter([(await c.get("/x")).status_code for _ in range(200)])
    assert statuses == Counter({200: 200})
    assert inst.calls["a.test"] == 5  # the consecutive-failure threshold, then ejected
    a = next(u for u in gw.snapshot()["upstreams"] if u["url"] == "http://a.test")
    assert a["ejected"] and a["ejections"] == 1 and a["failures"] == 5
    assert gw.parts.breaker.state(gw.clock()).value == "closed"
    assert gw.parts.limiter.inflight == 0


async def test_snapshot_and_metrics_per_instance(tmp_path: Path) -> None:
    """/snapshot lists the instances; metrics carry the instance label."""
    inst = Instances()
    gw = _gateway(inst, tmp_path)
    async with _client(gw) as c:
        await c.get("/x")
        snap = (await c.get("/_ballast/snapshot")).json()
        text = (await c.get("/_ballast/metrics")).text
    ups = snap["upstreams"]
    assert [u["url"] for u in ups] == [f"http://{h}" for h in HOSTS]
    for key in ("weight", "healthy", "ejected_until_s", "in_flight", "limit", "success_rate"):
        assert all(key in u for u in ups)
    assert snap["limiter"]["algorithm"] == "pool"
    assert snap["limiter"]["limit"] == sum(u["limit"] for u in ups)
    families = {f.name: f for f in text_string_to_metric_families(text)}
    limits = {s.labels["instance"] for s in families["ballast_upstream_concurrency_limit"].samples}
    assert limits == {f"http://{h}" for h in HOSTS}
    assert sum(s.value for s in families["ballast_upstream_attempts"].samples) == 1


async def test_reload_adds_and_removes_without_dropping(tmp_path: Path) -> None:
    """A request in flight on a removed instance finishes; new requests use the new list."""
    inst = Instances()
    inst.mode = {"a.test": "hold", "b.test": "hold"}
    inst.gate = asyncio.Event()
    gw = _gateway(inst, tmp_path, hosts=["a.test", "b.test"])
    async with _client(gw) as c:
        held = asyncio.ensure_future(c.get("/held"))
        while not inst.calls:
            await checkpoint()
        (gone,) = inst.calls
        (kept,) = {"a.test", "b.test"} - {gone}
        inst.mode[kept] = "ok"
        _write(tmp_path / "ballast.yaml", [kept, "c.test"], NO_PROBES)
        ok, message = await gw.reload()
        assert ok, message
        after = Counter([(await c.get("/x")).json()["host"] for _ in range(40)])
        inst.gate.set()
        response = await held
    assert response.status_code == 200 and response.json()["host"] == gone
    assert set(after) == {kept, "c.test"}
    assert [u["url"] for u in gw.snapshot()["upstreams"]] == [f"http://{kept}", "http://c.test"]
    assert gw.parts.limiter.inflight == 0 and gw.pool is not None and gw.pool.pool.draining == []


async def test_reload_refuses_leaving_the_pool(tmp_path: Path) -> None:
    """Going from a list to one URL needs a restart; nothing is applied."""
    gw = _gateway(Instances(), tmp_path)
    _write(tmp_path / "ballast.yaml", ["a.test"], NO_PROBES)
    ok, message = await gw.reload()
    assert not ok and "restart" in message


async def test_single_url_keeps_working() -> None:
    """One URL: no pool, the snapshot still lists it."""
    inst = Instances()
    config = load_config(env={"BALLAST_UPSTREAM": "http://a.test"})
    gw = build_gateway(config, transport=httpx.MockTransport(inst), env={})
    async with _client(gw) as c:
        assert (await c.get("/x")).status_code == 200
    assert gw.pool is None and gw.snapshot()["upstreams"][0]["url"] == "http://a.test"
