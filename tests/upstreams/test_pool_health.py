"""Active health: probe thresholds (pure) and the checker driven by a fake probe and sleep."""

from __future__ import annotations

import random

import pytest
from anyio.lowlevel import checkpoint

from ballast_asgi.core.breaker import Breaker
from ballast_asgi.core.limit import make_limit
from ballast_asgi.core.limiter import Limiter
from ballast_asgi.upstreams.checker import HealthChecker, HttpProbe
from ballast_asgi.upstreams.core.health import HealthPolicy, HealthState
from ballast_asgi.upstreams.core.instance import Instance, InstanceSpec
from ballast_asgi.upstreams.core.pool import Pool, PoolPolicy


def test_thresholds() -> None:
    """Three failures take an instance out, two passes bring it back, runs reset."""
    policy = HealthPolicy(unhealthy_threshold=3, healthy_threshold=2)
    h = HealthState()
    h.record(False, policy, "x")
    h.record(False, policy, "x")
    h.record(True, policy)
    h.record(False, policy, "x")
    h.record(False, policy, "x")
    assert h.healthy
    assert h.record(False, policy, "refused") and not h.healthy and h.last_error == "refused"
    assert not h.record(True, policy) and not h.healthy
    assert h.record(True, policy) and h.healthy and h.probes == 8


def test_jittered_delay_bounds() -> None:
    """Each delay is the interval +/- jitter."""
    policy = HealthPolicy(interval_ms=1_000, jitter=0.2)
    rng = random.Random(1)
    delays = [policy.next_delay_s(rng) for _ in range(1_000)]
    assert 0.8 <= min(delays) < 0.85 and 1.15 < max(delays) <= 1.2


def _pool(urls: list[str]) -> Pool:
    return Pool(
        [InstanceSpec(u) for u in urls],
        make_limiter=lambda: Limiter(make_limit("fixed", limit=4)),
        make_breaker=Breaker,
        policy=PoolPolicy(health=HealthPolicy(unhealthy_threshold=2, healthy_threshold=1)),
        rng=random.Random(2),
    )


class FakeProbe:
    """Answers from a table of URL -> pass, records every call."""

    def __init__(self) -> None:
        self.up: dict[str, bool] = {}
        self.calls: list[tuple[str, float]] = []

    async def __call__(self, url: str, timeout_s: float) -> tuple[bool, str | None]:
        self.calls.append((url, timeout_s))
        ok = self.up.get(url, True)
        return ok, None if ok else "refused"


@pytest.mark.anyio
async def test_checker_marks_instances_and_follows_reload() -> None:
    """Probes run per instance on the (fake) schedule; reload starts and stops them."""
    pool = _pool(["http://a:1", "http://b:2"])
    probe = FakeProbe()
    probe.up["http://b:2/health"] = False
    slept: list[float] = []
    changes: list[tuple[str, bool]] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await checkpoint()

    checker = HealthChecker(
        pool, probe=probe, rng=random.Random(3), sleep=sleep,
        on_change=lambda inst, healthy: changes.append((inst.key, healthy)),
    )  # fmt: skip
    checker.sync()
    for _ in range(20):
        await checkpoint()
    assert changes[0] == ("http://b:2", False)
    assert not pool.instances[1].health.healthy and pool.instances[0].health.healthy
    assert all(t == 1.0 for _, t in probe.calls)
    pool.set_instances([InstanceSpec("http://a:1")])
    checker.sync()
    assert checker.running == 1
    await checker.aclose()
    assert checker.running == 0 and len(slept) > 4


@pytest.mark.anyio
async def test_probe_once_recovers() -> None:
    """A passing probe brings an unhealthy instance back."""
    pool = _pool(["http://a:1"])
    probe = FakeProbe()
    checker = HealthChecker(pool, probe=probe)
    inst: Instance = pool.instances[0]
    probe.up["http://a:1/health"] = False
    assert not await checker.probe_once(inst)
    assert not await checker.probe_once(inst)
    assert not inst.health.healthy
    probe.up["http://a:1/health"] = True
    assert await checker.probe_once(inst) and inst.health.healthy
    await checker.aclose()


@pytest.mark.anyio
async def test_http_probe_refused_port() -> None:
    """The default probe reports a refused connection as a failure, never raising."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = HttpProbe()
    try:
        passed, error = await probe(f"http://127.0.0.1:{port}/health", 0.5)
    finally:
        await probe.aclose()
    assert not passed and error == "ConnectError"


def test_default_expectation_passes_any_answer_below_500() -> None:
    """By default a 404 (no health endpoint) passes and a 5xx fails; ``2xx`` wants 2xx/3xx."""
    default, strict = HealthPolicy(), HealthPolicy(expect="2xx")
    assert default.passes(404) and default.passes(200) and default.passes(499)
    assert not default.passes(500) and not default.passes(503)
    assert strict.passes(204) and strict.passes(302) and not strict.passes(404)


@pytest.mark.anyio
async def test_http_probe_counts_a_404_as_alive_by_default() -> None:
    """The default probe against an app without /health (real server, 404) passes."""
    from tests.e2e.nohealth_app import app
    from tests.e2e.support import free_port, serve_in_thread, stop_thread

    port = free_port()
    server, thread = serve_in_thread(app, port)
    probe, strict = HttpProbe(HealthPolicy().passes), HttpProbe()
    try:
        url = f"http://127.0.0.1:{port}/health"
        assert await probe(url, 2.0) == (True, None)
        assert await strict(url, 2.0) == (False, "status 404")
    finally:
        await probe.aclose()
        await strict.aclose()
        stop_thread(server, thread)
