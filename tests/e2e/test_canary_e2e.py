"""End to end: the gateway (uvicorn) in front of two real simulators, one of them the canary."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from tests.e2e.support import enter_together, free_port, stop_process, uvicorn_gateway, wait_http

pytestmark = pytest.mark.e2e


@contextmanager
def simulator(error_rate: float) -> Iterator[str]:
    """The simulator with fast service failing ``error_rate`` of requests; its base URL."""
    port, admin = free_port(), free_port()
    args = [sys.executable, "-m", "ballast_tools.upstream_sim", "--port", str(port),
            "--admin-port", str(admin), "--workers", "64", "--fast", "2ms", "--slow", "5ms",
            "--error-rate", str(error_rate), "--seed", "7"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_http(f"http://127.0.0.1:{admin}/health", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


@contextmanager
def canary_gateway(tmp_path: Path, canary_error_rate: float) -> Iterator[str]:
    """Stable (no errors) and canary simulators behind a gateway with weight 0.3."""
    with ExitStack() as stack:
        stable, canary = enter_together(stack, [simulator(0.0), simulator(canary_error_rate)])
        config = tmp_path / "ballast.yaml"
        config.write_text(
            f"upstream: {stable}\nmax_concurrent_requests: 64\n"
            f"canary:\n  upstream: {canary}\n  weight: 0.3\n  rule: sequential\n  alpha: 0.01\n"
        )
        with uvicorn_gateway(config) as (base, _pid):
            yield base


def _load(client: httpx.Client, seconds: float, stop_on_rollback: bool) -> dict[str, int]:
    """Sequential requests for up to ``seconds``: counts per X-Ballast-Version."""
    seen = {"stable": 0, "canary": 0}
    limit = time.monotonic() + seconds
    i = 0
    while time.monotonic() < limit:
        i += 1
        r = client.get(f"/item/{i}", headers={"X-Request-Id": f"req-{i}"})
        seen[r.headers["x-ballast-version"]] += 1
        polled = stop_on_rollback and i % 50 == 0
        if polled and client.get("/_ballast/canary").json()["state"] == "rolled_back":
            break
    return seen


def test_a_canary_with_30_percent_errors_is_rolled_back_then_gets_nothing(
    tmp_path: Path,
) -> None:
    """30 % canary errors: rolled back within 30 s on errors; afterwards only stable serves."""
    with canary_gateway(tmp_path, 0.3) as base, httpx.Client(base_url=base, timeout=5) as c:
        started = time.monotonic()
        _load(c, 30.0, stop_on_rollback=True)
        doc = c.get("/_ballast/canary").json()
        assert doc["state"] == "rolled_back", doc
        assert doc["decision"]["reason"] == "errors" and doc["weight"] == 0.0
        assert time.monotonic() - started < 30.0
        after = _load(c, 1.0, stop_on_rollback=False)
    assert after["canary"] == 0 and after["stable"] > 0


def test_an_identical_canary_is_not_rolled_back(tmp_path: Path) -> None:
    """Both versions healthy for 4 s of load: the canary keeps running and serves its share."""
    with canary_gateway(tmp_path, 0.0) as base, httpx.Client(base_url=base, timeout=5) as c:
        seen = _load(c, 4.0, stop_on_rollback=False)
        doc = c.get("/_ballast/canary").json()
    assert doc["state"] == "running" and seen["canary"] > 0 and seen["stable"] > seen["canary"]
    assert doc["counts"]["canary"]["errors"] == 0
