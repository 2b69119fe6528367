"""End to end: the generator against a real simulator on loopback, profile changed live."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from ballast_tools.loadgen.runner import LoadConfig, LoadRunner
from ballast_tools.loadgen.schedule import make_tiers
from ballast_tools.upstream_sim.model import Profile
from ballast_tools.upstream_sim.server import RunningSim, start_sim

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

TIERS = make_tiers([5, 35, 60], [3.0, 3.0, 3.0])


@pytest.fixture
async def sim() -> AsyncIterator[RunningSim]:
    """A simulator with 4 workers at 10 ms (400 rps) on free loopback ports."""
    running = await start_sim(Profile(workers=4, fast_s=0.010, slow_s=0.010), seed=1)
    try:
        yield running
    finally:
        await running.stop()


async def _run(sim: RunningSim, rate_rps: float) -> tuple[dict[str, int], float]:
    runner = LoadRunner(
        LoadConfig(target=sim.url + "/", rate_rps=rate_rps, duration_s=1.0, tiers=TIERS)
    )
    result = await runner.run()
    tally = result.stats.tally
    counts = {
        "sent": sum(t.sent for t in tally),
        "served": sum(t.served for t in tally),
        "not_issued": sum(t.not_issued for t in tally),
    }
    p99 = max(t.latency_served_s.quantile(0.99) for t in tally if t.served)
    return counts, p99


async def test_generator_and_simulator_and_live_profile(sim: RunningSim) -> None:
    """Below capacity little queues; after POST /profile cuts capacity to 50 rps it queues."""
    async with httpx.AsyncClient(base_url=sim.admin_url) as admin:
        counts, p99 = await _run(sim, 100)
        stats = (await admin.get("/stats")).json()
        assert counts == {"sent": 100, "served": 100, "not_issued": 0}
        assert stats["served"] == 100 and stats["max_queue_len"] < 20
        assert p99 < 0.2

        r = await admin.post("/profile", json={"workers": 1, "fast": "20ms", "slow": "20ms"})
        assert r.status_code == 200 and r.json()["capacity_rps"] == 50
        await admin.post("/stats/reset")

        counts, p99 = await _run(sim, 100)
        stats = (await admin.get("/stats")).json()
    assert counts == {"sent": 100, "served": 100, "not_issued": 0}
    assert stats["served"] == 100 and stats["max_queue_len"] >= 30
    assert stats["queue_wait_ms"]["p99"] > 500
    assert p99 > 0.5


async def test_generator_counts_inflight_cap_and_local_timeouts_apart(sim: RunningSim) -> None:
    """At the in-flight cap requests are not issued; slow answers expire at deadline + grace."""
    async with httpx.AsyncClient(base_url=sim.admin_url) as admin:
        await admin.post("/profile", json={"workers": 1, "fast": "600ms", "slow": "600ms"})
    tiers = make_tiers([0, 0, 1], [0.3, 0.3, 0.3])
    config = LoadConfig(sim.url + "/", rate_rps=50, duration_s=0.2, tiers=tiers, max_inflight=2)
    result = await LoadRunner(config).run()
    bulk = result.stats.tally[2]
    assert (bulk.sent, bulk.not_issued, bulk.not_issued_by) == (2, 8, {"inflight_cap": 8})
    assert (bulk.expired, bulk.expired_by, bulk.served) == (2, {"timeout": 2}, 0)
    assert 0.3 <= bulk.latency_all_s.max < 1.0
