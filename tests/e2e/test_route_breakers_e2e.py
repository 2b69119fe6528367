"""A real default gateway on uvicorn, clients on distinct loopback addresses (127.0.0.2..6).

The issue-28 checks as a black box would run them: one address sending 40
failing requests costs another address nothing; a real outage seen from five
addresses opens the breaker and is answered 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.raw import get, status_of
from tests.e2e.support import free_port, serve_in_thread, stop_thread, uvicorn_gateway

pytestmark = pytest.mark.e2e


async def upstream(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/get`` 200, ``/status/N`` N, ``/delay/S`` 200 after S seconds."""
    if scope["type"] != "http":
        return
    path: str = scope["path"]
    status = 200
    if path.startswith("/status/"):
        status = int(path.split("/")[2])
    elif path.startswith("/delay/"):
        await asyncio.sleep(float(path.split("/")[2]))
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": path.encode()})


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """The default gateway (no breaker or route settings) in front of a loopback port."""
    up_port = free_port()
    config = tmp_path / "ballast.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{up_port}\n")
    with uvicorn_gateway(config) as (base, _):
        yield base, up_port


def _client(base: str, address: str) -> httpx.Client:
    """A client whose connections come from ``address`` (any 127/8 address is local)."""
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=base, transport=transport, timeout=10)


def test_one_address_failing_forty_times_costs_another_address_nothing(
    gateway: tuple[str, int],
) -> None:
    """40 x 500 from 127.0.0.2: every request of 127.0.0.3 is answered by the upstream."""
    base, up_port = gateway
    server, thread = serve_in_thread(upstream, up_port)
    try:
        with _client(base, "127.0.0.2") as bad:
            failing = [bad.get("/status/500") for _ in range(40)]
        with _client(base, "127.0.0.3") as good:
            answers = [good.get(p) for p in ["/get"] * 20 + ["/status/500"] * 5 + ["/delay/0.05"]]
            snap = good.get("/_ballast/snapshot").json()
    finally:
        stop_thread(server, thread)
    assert [r.status_code for r in failing] == [500] * 40
    assert [r.status_code for r in answers] == [200] * 20 + [500] * 5 + [200]
    assert not any("x-ballast-reason" in r.headers for r in failing + answers)
    route = snap["routes"]["/status"]
    assert route["breaker"]["state"] == "closed" and route["breaker"]["failing_clients"] == 2
    assert snap["shed"] == {}


def test_an_outage_seen_from_five_addresses_opens_the_breaker_with_503(
    gateway: tuple[str, int],
) -> None:
    """Upstream down (connection refused) for 127.0.0.2..6: 502s, then 503 breaker_open."""
    base, _ = gateway  # nothing listens on the upstream port
    clients = [_client(base, f"127.0.0.{i}") for i in range(2, 7)]
    try:
        seen = [clients[i % 5].get("/get") for i in range(30)]
        snap = clients[0].get("/_ballast/snapshot").json()
    finally:
        for c in clients:
            c.close()
    assert seen[0].status_code == 502
    shed = [r for r in seen if r.headers.get("x-ballast-reason") == "breaker_open"]
    assert len(shed) >= 15
    assert {r.status_code for r in shed} == {503}
    assert all(int(r.headers["retry-after"]) >= 1 for r in shed)
    # The upstream never answered, so /get never got a route of its own: it is on "other".
    assert "/get" not in snap["routes"] and snap["routes"]["other"]["breaker"]["state"] == "open"


def test_5xx_from_five_addresses_opens_the_breaker_of_that_route_only(
    gateway: tuple[str, int],
) -> None:
    """Every client gets 500 on /status: from five addresses it opens; /get is still served."""
    base, up_port = gateway
    server, thread = serve_in_thread(upstream, up_port)
    clients = [_client(base, f"127.0.0.{i}") for i in range(2, 7)]
    try:
        seen = [clients[i % 5].get("/status/500") for i in range(30)]
        healthy = clients[0].get("/get")
    finally:
        for c in clients:
            c.close()
        stop_thread(server, thread)
    shed = [r for r in seen if r.headers.get("x-ballast-reason") == "breaker_open"]
    assert shed and {r.status_code for r in shed} == {503}
    assert [r.status_code for r in seen[:10]] == [500] * 10
    assert healthy.status_code == 200 and "x-ballast-reason" not in healthy.headers


def test_hostile_paths_cannot_grow_routes_labels_or_snapshot(tmp_path: Path) -> None:
    """2,000 invented paths and raw odd targets: routes stay <= max_groups + 1, gateway serves."""
    up_port = free_port()
    config = tmp_path / "ballast.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{up_port}\nauto_routes: {{max_groups: 8}}\n")
    server, thread = serve_in_thread(upstream, up_port)
    rng = random.Random(11)
    odd = ["/%FF%FE/x", "/%2e%2e/x", "/" + "a" * 5000, "/..;/x", "/\u00e9t\u00e9", "//", "/%00"]
    try:
        with uvicorn_gateway(config) as (base, _):
            port = int(base.rsplit(":", 1)[1])
            alphabet = "abcdefghijklmnopqrstuvwxyz0123456789-_.~"
            segments = ["".join(rng.choices(alphabet, k=12)) for _ in range(200)]
            with httpx.Client(base_url=base, timeout=10) as c:
                for i in range(2_000):  # the upstream answers 200 to anything: all "known"
                    assert c.get(f"/{rng.choice(segments)}/{i}").status_code == 200
                statuses = [status_of(get(port, p.encode("utf-8").decode("latin-1"))) for p in odd]
                snap = c.get("/_ballast/snapshot").json()
                metrics = c.get("/_ballast/metrics").text
                assert c.get("/get").status_code == 200
    finally:
        stop_thread(server, thread)
    assert all(s in (200, 400, 404, 431) for s in statuses), statuses
    assert len(snap["routes"]) <= 8 + 1
    labels = {line.split('route="', 1)[1].split('"', 1)[0]
              for line in metrics.splitlines() if 'route="' in line}  # fmt: skip
    assert 1 < len(labels) <= 8 + 1
