"""A gateway with the ``discovery`` section, in-process: gate, swap, snapshot, selector."""

from __future__ import annotations

import socket

import httpx
import pytest

from ballast_asgi.config.load import build_config
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.discovery.core.model import ConfigVersion, Instance
from ballast_asgi.discovery.selector import ListSelector
from ballast_asgi.gateway import Gateway
from ballast_asgi.proxy.upstream import Upstream
from ballast_asgi.server.cli import banner
from tests.e2e.support import free_port

pytestmark = pytest.mark.anyio
A = Instance("http://a.test:81")
B = Instance("http://b.test:82")


def _hosts() -> tuple[list[str], httpx.MockTransport]:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.netloc.decode())
        return httpx.Response(200, text="ok")

    return seen, httpx.MockTransport(handler)


def _gateway(transport: httpx.MockTransport, **extra: object) -> Gateway:
    """A gateway whose etcd is a closed port (nothing is ever read from it here)."""
    etcd = f"http://127.0.0.1:{free_port()}"
    data = {"discovery": {"etcd": {"endpoints": [etcd]}, "service": "api"}, **extra}
    return Gateway(build_config(data), transport=transport)


def _client(gw: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(gw), base_url="http://gw")


async def test_no_version_yet_answers_503_but_admin_works() -> None:
    """Without an upstream and before a first version: 503 no_instances; admin still serves."""
    seen, transport = _hosts()
    gw = _gateway(transport)
    async with _client(gw) as c:
        r = await c.get("/x")
        snap = (await c.get("/_ballast/snapshot")).json()
    await gw.discovery.stop()  # type: ignore[union-attr]
    assert r.status_code == 503 and r.json()["error"] == "no_instances"
    assert r.headers["x-ballast-reason"] == "no_instances" and r.headers["retry-after"] == "1"
    assert r.headers["retry-after"] == "1" and seen == []
    assert snap["config_version"] is None and snap["discovery"]["instances"] == []


async def test_before_a_first_version_nothing_invented_is_listed() -> None:
    """Before a first version: no placeholder upstream in the snapshot, the banner says waiting."""
    _, transport = _hosts()
    gw = _gateway(transport)
    async with _client(gw) as c:
        snap = (await c.get("/_ballast/snapshot")).json()
    await gw.discovery.stop()  # type: ignore[union-attr]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        line = banner(gw, sock, None)
    assert snap["upstreams"] == [] and snap["config"]["upstream"] == []
    assert snap["pool"]["waiting_for_discovery"] is True
    assert "-> waiting for the first discovery version (limiter gradient)" in line


async def test_an_applied_version_swaps_the_upstream_list() -> None:
    """Version 1 = [A, B]: requests alternate over both; version 2 = [B]: only B."""
    seen, transport = _hosts()
    gw = _gateway(transport)
    runtime = gw.discovery
    assert runtime is not None
    assert runtime.follower.offer(ConfigVersion(1, (A, B)).encode())
    async with _client(gw) as c:
        for _ in range(20):
            assert (await c.get("/x")).status_code == 200
        assert sorted(set(seen)) == ["a.test:81", "b.test:82"]
        seen.clear()
        runtime.follower.offer(ConfigVersion(2, (B,)).encode())
        for _ in range(3):
            await c.get("/x")
        snap = (await c.get("/_ballast/snapshot")).json()
    await runtime.stop()
    assert seen == ["b.test:82"] * 3
    assert snap["config_version"] == 2 and snap["discovery"]["instances"] == [B.to_json()]
    assert [h["config_version"] for h in snap["discovery"]["history"]] == [1, 2]


async def test_a_configured_upstream_serves_until_the_first_version() -> None:
    """discovery plus upstream: the upstream is the list until a version arrives."""
    seen, transport = _hosts()
    gw = _gateway(transport, upstream="http://boot.test:80")
    async with _client(gw) as c:
        assert (await c.get("/x")).status_code == 200
    await gw.discovery.stop()  # type: ignore[union-attr]
    assert seen == ["boot.test"]


async def test_reload_refuses_a_discovery_change(tmp_path: object) -> None:
    """discovery.* changes need a restart: the reload says so and applies nothing."""
    from pathlib import Path

    path = Path(str(tmp_path)) / "gw.yaml"
    etcd = f"http://127.0.0.1:{free_port()}"
    path.write_text(f"discovery: {{etcd: {{endpoints: [{etcd}]}}, service: api}}\n")
    from ballast_asgi.config import load_config

    gw = Gateway(load_config(env={}, path=path), config_path=path, env={})
    path.write_text(f"discovery: {{etcd: {{endpoints: [{etcd}]}}, service: other}}\n")
    ok, message = await gw.reload()
    assert not ok and "discovery" in message


def test_a_gateway_needs_an_upstream_or_discovery() -> None:
    """Neither upstream nor discovery: the config is refused naming BALLAST_UPSTREAM."""
    with pytest.raises(ConfigError, match="BALLAST_UPSTREAM"):
        build_config({})


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"etcd": {"endpoints": []}, "service": "s"}, "discovery.etcd.endpoints"),
        ({"etcd": {"endpoints": ["https://h:1"]}, "service": "s"}, "discovery.etcd.endpoints"),
        ({"etcd": {"endpoints": ["h:1"], "prefix": "x"}, "service": "s"}, "discovery.etcd.prefix"),
        ({"etcd": {"endpoints": ["h:1"]}, "service": "a/b"}, "discovery.service"),
        ({"etcd": {"endpoints": ["h:1"]}}, "discovery.service"),
        ({"etcd": {"endpoints": ["h:1"]}, "service": "s", "debounce_ms": 900}, "max_wait_ms"),
    ],
)
def test_bad_discovery_config_names_the_field(section: dict[str, object], field: str) -> None:
    """Each malformed discovery key is refused with its dotted path in the message."""
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_config({"discovery": section})


# -- the list selector ---------------------------------------------------------------
def test_list_selector_rotates_and_skips_excluded() -> None:
    """Round robin over the list; an excluded upstream is skipped unless it is the only one."""
    sel = ListSelector([A.url, B.url])
    a, b = (Upstream.parse(u) for u in (A.url, B.url))
    assert [sel.choose(None) for _ in range(4)] == [a, b, a, b]
    assert sel.choose(None, exclude={a}) == b and sel.choose(None, exclude={a}) == b
    assert sel.choose(None, exclude={a, b}) in (a, b)


def test_list_selector_keeps_an_unreachable_upstream_out_for_a_while() -> None:
    """After a connect error the upstream is skipped for down_s seconds."""
    now = [0.0]
    sel = ListSelector([A.url, B.url], clock=lambda: now[0], down_s=1.0)
    a, b = (Upstream.parse(u) for u in (A.url, B.url))
    sel.report(a, AttemptOutcome.CONNECT_ERROR, None, 0.0)
    assert {sel.choose(None) for _ in range(4)} == {b}
    now[0] = 1.5
    assert a in {sel.choose(None) for _ in range(2)}


def test_list_selector_refuses_an_empty_list() -> None:
    """An empty version cannot be applied: the last list stays."""
    sel = ListSelector([A.url])
    with pytest.raises(ValueError, match="empty"):
        sel.set_instances([])
    sel.set_instances([B])
    assert [u.port for u in sel.upstreams()] == [82]


async def test_metrics_show_the_applied_version() -> None:
    """/metrics has ballast_discovery_config_version and instances after a version applies."""
    _, transport = _hosts()
    gw = _gateway(transport)
    assert gw.discovery is not None
    gw.discovery.follower.offer(ConfigVersion(4, (A, B)).encode())
    async with _client(gw) as c:
        text = (await c.get("/_ballast/metrics")).text
    assert "ballast_discovery_config_version 4.0" in text
    assert "ballast_discovery_instances 2.0" in text
    assert "ballast_discovery_rejected_versions_total 0.0" in text


async def test_reload_with_discovery_keeps_the_pool_adaptation(tmp_path: object) -> None:
    """A reload of unrelated keys keeps PoolLimit and the pool-scaled breaker under discovery."""
    from pathlib import Path

    from ballast_asgi.config import load_config
    from ballast_asgi.upstreams.core.limit import PoolLimit

    path = Path(str(tmp_path)) / "gw.yaml"
    etcd = f"http://127.0.0.1:{free_port()}"
    head = f"discovery: {{etcd: {{endpoints: [{etcd}]}}, service: api}}\n"
    head += "upstreams: {per_instance_limit: true}\n"
    path.write_text(head + "limiter: {window_ms: 500}\nbreaker: {open_ms: 2000}\n")
    _, transport = _hosts()
    gw = Gateway(load_config(env={}, path=path), config_path=path, env={}, transport=transport)
    assert gw.discovery is not None
    assert gw.discovery.follower.offer(ConfigVersion(1, (A, B)).encode())
    before = gw.parts.breaker.consecutive_failures
    assert isinstance(gw.parts.limiter.algorithm, PoolLimit)
    path.write_text(head + "limiter: {window_ms: 700}\nbreaker: {open_ms: 3000}\n")
    ok, message = await gw.reload()
    await gw.discovery.stop()
    assert ok, message
    assert isinstance(gw.parts.limiter.algorithm, PoolLimit)
    assert gw.parts.breaker.consecutive_failures == before == 2 * 10
    assert gw.parts.breaker.open_s == 3.0
