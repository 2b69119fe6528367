"""Reload under load with discovery and a pool (issue 29): real etcd, two registered
simulators, ``uvicorn ballast_asgi.gateway:app`` with per-instance limits; three reloads
that change ``limiter.window_ms`` and ``breaker.open_ms`` during open-loop traffic keep
the per-instance limits (``PoolLimit`` over both instances) and the pool-scaled breaker
(20 consecutive failures), apply the new open period, and lose no request."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.e2e.etcd_server import etcd_server
from tests.e2e.support import uvicorn_gateway
from tests.e2e.test_discovery_gateway_e2e import (
    READY_S,
    Instance,
    _load_in_background,
    _snapshot,
    _urls,
    _wait,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TOKEN = "t" * 32


def _config(path: Path, etcd: str, window_ms: int, open_ms: int) -> None:
    path.write_text(
        f"discovery: {{etcd: {{endpoints: [{etcd}]}}, service: judged}}\n"
        "upstreams: {per_instance_limit: true}\n"
        f"admin: {{token: {TOKEN}}}\n"
        f"limiter: {{window_ms: {window_ms}}}\nbreaker: {{open_ms: {open_ms}}}\n"
    )


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[str, Path, str, list[Instance]]]:
    """etcd, two registered simulators, and a uvicorn gateway with a pool over both."""
    with ExitStack() as stack:
        etcd = stack.enter_context(etcd_server())
        instances = [Instance(etcd), Instance(etcd)]
        for inst in instances:
            stack.callback(inst.stop)
        config = tmp_path / "gw.yaml"
        _config(config, etcd.url, 500, 2000)
        base, _ = stack.enter_context(uvicorn_gateway(config, READY_S))
        _wait(base, lambda s: len(_urls(s)) == 2, READY_S)
        yield base, config, etcd.url, instances


def _pool_kept(snap: dict[str, object]) -> tuple[object, object, object]:
    limiter, breaker = snap["limiter"], snap["breaker"]
    state = limiter["algorithm_state"]  # type: ignore[index]
    return limiter["algorithm"], state["instances"], breaker["consecutive_failures_to_open"]  # type: ignore[index]


def test_reloads_under_load_keep_pool_limits_and_breaker(
    gateway: tuple[str, Path, str, list[Instance]],
) -> None:
    """Three reloads mid-load: PoolLimit over 2 instances, breaker at 20, no request lost."""
    base, config, etcd, (a, b) = gateway
    assert _pool_kept(_snapshot(base)) == ("pool", 2, 20)
    out, thread = _load_in_background(base, 4.0)
    answers = []
    for i, (window_ms, open_ms) in enumerate([(700, 3000), (900, 4000), (600, 5000)]):
        time.sleep(0.8)  # spread the reloads over the load (bounded, no correctness wait)
        _config(config, etcd, window_ms, open_ms)
        r = httpx.post(base + "/_ballast/reload", headers={"Authorization": f"Bearer {TOKEN}"})
        answers.append((i, r.status_code))
    thread.join(60)  # type: ignore[attr-defined]
    statuses = out[0]
    snap = _snapshot(base)
    assert answers == [(0, 200), (1, 200), (2, 200)]
    assert statuses.count(200) == len(statuses), {s: statuses.count(s) for s in set(statuses)}
    assert _pool_kept(snap) == ("pool", 2, 20)
    assert snap["breaker"]["next_open_s"] == 5.0  # type: ignore[index]
    assert snap["config"]["version"] == 4  # type: ignore[index]
    assert a.served() > 0 and b.served() > 0
