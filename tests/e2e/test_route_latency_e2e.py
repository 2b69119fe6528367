"""Real uvicorn: a quiet spell of fast requests, then a burst of 40 slow ones (issue 28).

The default gateway in front of a tiny app whose ``/slow`` endpoint takes
0.3 s and ``/fast`` answers at once. Before ADR 0016 the quiet spell shrank
the one limit to its floor (4) and the burst went through in ten rounds;
now the slow route gets its own limit, which a quiet gateway starts at
``limiter.quiet_limit`` (64): the 40 requests are admitted at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.support import free_port, serve_in_thread, stop_thread, uvicorn_gateway

pytestmark = pytest.mark.e2e

SLOW_S = 0.3
BURST = 40


async def two_speed_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/slow*`` sleeps ``SLOW_S``; anything else answers at once."""
    if scope["type"] != "http":
        return
    if scope["path"].startswith("/slow"):
        await asyncio.sleep(SLOW_S)
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(gateway base URL, direct upstream base URL)."""
    up_port = free_port()
    server, thread = serve_in_thread(two_speed_app, up_port)
    config = tmp_path / "ballast.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{up_port}\n")
    try:
        with uvicorn_gateway(config) as (base, _):
            yield base, f"http://127.0.0.1:{up_port}"
    finally:
        stop_thread(server, thread)


async def burst(base: str) -> tuple[float, list[int]]:
    """Send ``BURST`` concurrent ``/slow`` requests; (seconds to the last answer, statuses)."""
    limits = httpx.Limits(max_connections=BURST + 5)
    async with httpx.AsyncClient(base_url=base, timeout=10, limits=limits) as client:
        start = time.monotonic()
        answers = await asyncio.gather(*(client.get(f"/slow/{i}") for i in range(BURST)))
        return time.monotonic() - start, [r.status_code for r in answers]


def test_burst_of_slow_requests_after_a_quiet_spell_is_not_throttled(
    setup: tuple[str, str],
) -> None:
    """After >1 s of single fast requests, 40 concurrent slow ones all run in one round."""
    base, _direct = setup
    with httpx.Client(base_url=base, timeout=5) as client:
        end = time.monotonic() + 1.5  # the quiet spell: one fast request at a time
        while time.monotonic() < end:
            assert client.get("/get").status_code == 200
        before = client.get("/_ballast/snapshot").json()
    _took, statuses = asyncio.run(burst(base))
    assert statuses == [200] * BURST
    with httpx.Client(base_url=base, timeout=5) as client:
        snap = client.get("/_ballast/snapshot").json()
    parts = snap["limiter"]["partitions"]
    assert parts["/slow"]["limit"] >= BURST, parts
    assert before["limiter"]["partitions"]["/get"]["limit"] >= 4
    # nobody waited for a permit: all 40 in one round (wall time is not asserted: shared CPUs)
    assert snap["limiter"]["rejected"] == 0


def test_client_chosen_paths_cannot_grow_the_route_table(setup: tuple[str, str]) -> None:
    """255 distinct, long and odd first segments: at most limiter.max_routes limits."""
    base, _ = setup
    paths = [f"/seg{i}/x" for i in range(250)]
    paths += ["/" + "a" * 5000, "/%00%ff/x", "/..%2f..%2f", "//double", "/\u00e9t\u00e9"]
    with httpx.Client(base_url=base, timeout=5) as client:
        for path in paths:
            assert client.get(path).status_code in (200, 400, 404, 414, 431)
        snap = client.get("/_ballast/snapshot").json()
    parts = snap["limiter"]["partitions"]
    # segments the upstream never answered are the route table's "other": the limiter
    # keys them by first segment, at most limiter.max_routes (64), the rest in ~other
    assert len(parts) <= 64 and "~other" in parts
    assert all(len(key) <= 49 for key in parts)
