"""Priority tiers and live reload end to end through ``build_gateway`` (reservation, forgery).

The upstream is an ``httpx.MockTransport`` whose async handler parks each
request on an ``asyncio.Event`` the test sets, so "in flight" and "queued" are
exact states, not timings. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from ballast_asgi.config import load_config
from ballast_asgi.gateway import Gateway, build_gateway
from tests.fakes import HoldingHandler, until

pytestmark = pytest.mark.anyio

WAIT_S = 5.0


def write_config(path: Path, body: str) -> Path:
    path.write_text("upstream: http://up.test\n" + body)
    return path


def gateway(path: Path, up: HoldingHandler) -> Gateway:
    return build_gateway(
        load_config(env={}, path=path),
        transport=httpx.MockTransport(up),
        config_path=path,
        env={},
    )


def client(gw: Gateway, peer: tuple[str, int] = ("127.0.0.1", 40000)) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=gw, client=peer)
    return httpx.AsyncClient(transport=transport, base_url="http://gw")


def sample(gw: Gateway, name: str, **labels: str) -> float:
    return gw.metrics.registry.get_sample_value(name, labels) or 0.0


def fixed(limit: int, extra: str = "") -> str:
    return (
        f"max_concurrent_requests: {limit}\n"
        f"limiter:\n  algorithm: fixed\n  fixed_limit: {limit}\n" + extra
    )


async def test_bulk_flood_cannot_fill_the_queue_against_critical(tmp_path: Path) -> None:
    """A bulk flood is refused with queue_full at the shared half; critical requests
    still queue in the reserved half and are served first when permits free."""
    queue = "admission_queue:\n  enabled: true\n  max_queue_size: 4\n  per_priority: true\n"
    up = HoldingHandler()
    gw = gateway(write_config(tmp_path / "b.yaml", fixed(2, queue)), up)
    async with client(gw) as c:

        def get(path: str, tier: str) -> asyncio.Task[httpx.Response]:
            return asyncio.ensure_future(c.get(path, headers={"X-Priority": tier}))

        running = [get(f"/bulk/run{i}", "bulk") for i in range(2)]
        await until(lambda: len(up.arrived) == 2)
        queued_bulk = [get(f"/bulk/q{i}", "bulk") for i in range(2)]
        await until(lambda: gw.parts.queue.total == 2)
        refused = await asyncio.wait_for(
            asyncio.gather(
                *(c.get(f"/bulk/x{i}", headers={"X-Priority": "bulk"}) for i in range(3))
            ),
            WAIT_S,
        )
        assert [r.headers["x-ballast-reason"] for r in refused] == ["queue_full"] * 3
        critical = [get(f"/critical/{i}", "critical") for i in range(2)]
        await until(lambda: gw.parts.queue.total == 4)
        assert sample(gw, "ballast_admission_queued_total", outcome="queue_full") == 3
        assert sample(gw, "ballast_admission_queue_depth", priority="critical") == 2
        assert sample(gw, "ballast_admission_queue_depth", priority="bulk") == 2
        up.gate.set()
        served = await asyncio.wait_for(asyncio.gather(*running, *queued_bulk, *critical), WAIT_S)
    assert [r.status_code for r in served] == [200] * 6
    assert up.arrived[2:4] == ["/critical/0", "/critical/1"]
    assert sample(gw, "ballast_admission_queued_total", outcome="admitted") == 4
    assert sample(gw, "ballast_admission_queue_depth", priority="critical") == 0
    assert sample(gw, "ballast_shed_total", reason="queue_full", priority="bulk") == 3
    assert gw.parts.limiter.inflight == 0


@pytest.mark.parametrize(
    ("peer", "tier", "ignored"),
    [("203.0.113.7", "standard", 1.0), ("10.1.2.3", "critical", 0.0)],
)
async def test_x_priority_is_honoured_only_from_trusted_networks(
    tmp_path: Path, peer: str, tier: str, ignored: float
) -> None:
    """A forged X-Priority from an untrusted peer is ignored (counted); from a trusted
    network it sets the tier, end to end through the gateway."""
    rules = "priority:\n  trust_header: false\n  trusted_networks: ['10.0.0.0/8']\n"
    up = HoldingHandler(hold="/never")
    gw = gateway(write_config(tmp_path / "p.yaml", rules), up)
    async with client(gw, (peer, 51000)) as c:
        served = await c.get("/orders", headers={"X-Priority": "critical"})
        shed = await c.get("/orders", headers={"X-Priority": "0", "X-Deadline-Ms": "0"})
    assert served.status_code == 200
    assert shed.status_code == 429 and shed.json()["priority"] == tier
    assert sample(gw, "ballast_requests_total", priority=tier) == 2
    assert sample(gw, "ballast_priority_header_ignored_total") == 2 * ignored


async def test_reload_under_load_loses_nothing_and_applies_the_new_limit(tmp_path: Path) -> None:
    """Requests in flight and queued under the old config are all served exactly once;
    a raised limit reaches queued waiters at once; version bumps; in-flight returns to 0."""
    queue = "admission_queue:\n  enabled: true\n  max_queue_size: 100\nadmin:\n  token: s3cret\n"
    path = write_config(tmp_path / "r.yaml", fixed(2, queue))
    up = HoldingHandler()
    gw = gateway(path, up)
    async with client(gw) as c:
        tasks = [asyncio.ensure_future(c.get(f"/r/{i}")) for i in range(12)]
        await until(lambda: len(up.arrived) == 2 and gw.parts.queue.total == 10)

        write_config(path, fixed(5, queue))
        ok, message = await gw.reload()
        assert ok, message
        await until(lambda: len(up.arrived) == 5)
        assert gw.parts.limiter.inflight == 5 and gw.parts.queue.total == 7

        write_config(path, fixed(6, queue))
        auth = {"Authorization": "Bearer s3cret"}
        reply = await c.post("/_ballast/reload", headers=auth)
        assert reply.status_code == 200 and reply.json()["reloaded"] is True
        await until(lambda: len(up.arrived) == 6)

        up.gate.set()
        responses = await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
        snap = (await c.get("/_ballast/snapshot")).json()
    assert [r.status_code for r in responses] == [200] * 12
    assert sorted(r.json()["path"] for r in responses) == sorted(f"/r/{i}" for i in range(12))
    assert sorted(up.arrived) == sorted(f"/r/{i}" for i in range(12))  # each exactly once
    assert up.peak == 6
    assert snap["limiter"]["limit"] == 6 and snap["limiter"]["inflight"] == 0
    assert snap["limiter"]["double_releases"] == 0
    assert snap["queue"]["total"] == 0
    assert snap["config"]["version"] == 3
    assert sample(gw, "ballast_config_reloads_total", result="ok") == 2


async def test_reload_flips_dry_run_on_for_new_requests(tmp_path: Path) -> None:
    """Turning load_shed_dry_run on by reload: the next request over the limit is admitted
    and counted as a would-be shed; the snapshot shows dry-run on."""
    no_queue = "admission_queue:\n  enabled: false\n"
    path = write_config(tmp_path / "d.yaml", fixed(1, no_queue))
    up = HoldingHandler(hold="/hold")
    gw = gateway(path, up)
    async with client(gw) as c:
        held = asyncio.ensure_future(c.get("/hold", headers={"X-Priority": "bulk"}))
        await until(lambda: len(up.arrived) == 1)
        before = await c.get("/x", headers={"X-Priority": "bulk"})
        assert before.status_code == 429 and before.headers["x-ballast-reason"] == "limit"

        write_config(path, fixed(1, no_queue + "load_shed_dry_run: true\n"))
        ok, message = await gw.reload()
        assert ok, message
        after = await c.get("/y", headers={"X-Priority": "bulk"})
        snap = (await c.get("/_ballast/snapshot")).json()
        up.gate.set()
        assert (await asyncio.wait_for(held, WAIT_S)).status_code == 200
    assert after.status_code == 200 and after.json()["path"] == "/y"
    assert snap["config"]["dry_run"] is True
    assert snap["dry_run"] == {"enabled": True, "would_shed": {"limit": {"bulk": 1.0}}}
    assert snap["shed"] == {"limit": {"bulk": 1.0}}
    assert snap["limiter"]["inflight"] == 1  # the admitted one held no permit
    assert gw.parts.limiter.inflight == 0
