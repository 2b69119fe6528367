"""The fused ``Pipeline`` and the per-stage middleware chain give the same responses.

Both compositions call the same decision object of each stage (``AdmissionStage``,
``CapacityStage``, ...; ADR 0018), so they agree by construction; this is the
one test that says so, for a representative script: every shed reason,
success with and without a body, malformed heads and an upstream failure that
retries and opens the breaker, enforcing and dry-run. Each composition gets
its own parts over the same fake clock, seeded randomness and real
``ProxyApp`` (an ``httpx.MockTransport`` upstream), and the two transcripts
(responses, shed counters, what reached the upstream) must be equal.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from ballast_asgi.config import build_config
from ballast_asgi.core.limiter import Permit
from ballast_asgi.core.outcome import Outcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.queue import Waiter
from ballast_asgi.gateway.stack import Parts, build_parts, build_stack
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.pipeline import Pipeline
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.telemetry.metrics import Metrics
from tests.fakes import FakeClock

pytestmark = pytest.mark.anyio

#: What a response is compared by (no header here is time- or random-dependent).
_HEADERS = ("x-ballast-reason", "retry-after", "ratelimit", "ratelimit-policy", "content-type")


@dataclass
class Rig:
    """One composition: its parts, the upstream's log, what it answered."""

    parts: Parts
    clock: FakeClock
    app: Any
    upstream: list[str] = field(default_factory=list)
    held: list[Permit] = field(default_factory=list)
    waiters: list[Waiter] = field(default_factory=list)
    transcript: list[tuple[Any, ...]] = field(default_factory=list)


def _rig(config: dict[str, Any], *, pipeline: bool) -> Rig:
    cfg = build_config({"upstream": "http://up.test", **config})
    clock = FakeClock()
    parts = build_parts(cfg, Metrics(), clock=clock, rng=random.Random(7))
    rig = Rig(parts, clock, None)

    def upstream(request: httpx.Request) -> httpx.Response:
        rig.upstream.append(f"{request.method} {request.url.path} {request.content!r}")
        if request.url.path == "/fail":
            raise httpx.ConnectError("refused", request=request)
        clock.advance(0.05)  # every success takes 50 ms: the limiter's minimum RTT
        return httpx.Response(200, content=b"ok " + request.content)

    proxy = ProxyApp("http://up.test", config=cfg.proxy, clock=clock,
                     transport=httpx.MockTransport(upstream))  # fmt: skip
    rig.app = build_stack(proxy, parts, cfg, retries=True, pipeline=pipeline)
    assert isinstance(rig.app, Pipeline if pipeline else AdmissionMiddleware)
    return rig


#: A step: a request (method, path, headers, body) or an action on the rig.
Step = tuple[str, str, dict[str, str], bytes] | Callable[[Rig], None]


def _hold_permits(rig: Rig) -> None:
    while (permit := rig.parts.limiter.try_acquire(rig.clock())) is not None:
        rig.held.append(permit)


def _release_permits(rig: Rig) -> None:
    for permit in rig.held:
        permit.release(Outcome.IGNORED, rig.clock())
    rig.held.clear()


def _fill_capacity(rig: Rig) -> None:
    capacity = rig.parts.capacity
    assert capacity is not None
    while capacity.try_enter(Priority.CRITICAL):
        pass


def _empty_capacity(rig: Rig) -> None:
    capacity = rig.parts.capacity
    assert capacity is not None
    while capacity.held:
        capacity.leave()


def _fill_queue(rig: Rig) -> None:
    loop = asyncio.get_running_loop()
    for _ in range(rig.parts.queue.max_size):
        waiter = Waiter(Priority.CRITICAL, rig.clock(), handle=loop.create_future())
        assert rig.parts.queue.push(waiter).accepted
        rig.waiters.append(waiter)


def _empty_queue(rig: Rig) -> None:
    for waiter in rig.waiters:
        rig.parts.queue.remove(waiter)
    rig.waiters.clear()


def _get(path: str = "/ok", **headers: str) -> Step:
    return ("GET", path, {k.replace("_", "-"): v for k, v in headers.items()}, b"")


def _post(body: bytes, path: str = "/ok") -> Step:
    return ("POST", path, {}, body)


SCRIPT: list[Step] = [
    _get(),  # success (and the limiter learns a 50 ms minimum RTT)
    _post(b"payload"),  # success through the body stage
    _get(x_deadline_ms="0"),  # deadline
    _get(x_deadline_ms="10"),  # early_drop: 10 ms left, 50 ms needed
    _get(x_deadline_ms="soon"),  # a malformed header: 400
    ("GET", "/ok", {f"x-h{i}": "v" for i in range(30)}, b""),  # too many headers: 431
    _post(b"x" * 2_000),  # a declared body over max_body_bytes: 413
    _fill_capacity,
    _get(),  # capacity
    _post(b"held"),  # capacity, before any byte is read
    _empty_capacity,
    _hold_permits,
    _get(),  # queue_timeout (the queue waits 1 ms for a permit)
    _fill_queue,
    _get(),  # queue_full
    _empty_queue,
    _release_permits,
    _get("/fail"),  # an upstream failure: retried once, both attempts fail: 502
    _get("/fail"),  # breaker_open (the route's breaker opened), nothing upstream
]


async def _play(rig: Rig, script: list[Step]) -> list[tuple[Any, ...]]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(rig.app),
                                 base_url="http://gw") as client:  # fmt: skip
        for step in script:
            if callable(step):
                step(rig)
                continue
            method, path, headers, body = step
            response = await client.request(method, path, headers=headers, content=body)
            kept = tuple(response.headers.get(h) for h in _HEADERS)
            rig.transcript.append((method, path, response.status_code, kept, response.content))
    return rig.transcript


def _counters(rig: Rig) -> Counter[tuple[str, tuple[tuple[str, str], ...]]]:
    names = ("ballast_shed_total", "ballast_dry_run_shed_total", "ballast_requests_total",
             "ballast_bad_requests_total", "ballast_retries_total")  # fmt: skip
    out: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
    for family in rig.parts.metrics.registry.collect():
        for s in family.samples:
            if s.name in names and s.value:
                out[(s.name, tuple(sorted(s.labels.items())))] += int(s.value)
    return out


BASE: dict[str, Any] = {
    "shed": {"retry_after_jitter": 0.0},
    "limiter": {"algorithm": "fixed", "fixed_limit": 2},
    "admission": {"early_drop": True, "max_headers": 20},
    "admission_queue": {"max_queue_size": 4, "queue_timeout_ms": 1},
    "capacity": {"max_held_requests": 4},
    "breaker": {"consecutive_failures": 2, "min_failing_clients": 1},
    "retry": {"backoff_base_ms": 0, "backoff_max_ms": 0},
    "proxy": {"max_body_bytes": 1_000},
}


@pytest.mark.parametrize("dry_run", [False, True], ids=["enforcing", "dry_run"])
async def test_pipeline_and_chain_answer_the_script_alike(dry_run: bool) -> None:
    """Every shed reason, success, bad heads, an upstream failure: same answers either way."""
    config = {**BASE, "load_shed_dry_run": dry_run}
    fused, chain = _rig(config, pipeline=True), _rig(config, pipeline=False)
    assert await _play(fused, SCRIPT) == await _play(chain, SCRIPT)
    assert fused.upstream == chain.upstream and _counters(fused) == _counters(chain)
    statuses = [t[2] for t in fused.transcript]
    if not dry_run:  # the script reaches every reason it means to
        reasons = {t[3][0] for t in fused.transcript} - {None}
        assert reasons == {"deadline", "early_drop", "capacity", "queue_timeout", "queue_full",
                           "breaker_open"}, fused.transcript  # fmt: skip
        assert statuses[:3] == [200, 200, 429] and {400, 431, 413, 502, 503} <= set(statuses)
    for rig in (fused, chain):
        assert rig.parts.limiter.inflight == 0 and rig.parts.queue.total == 0
        assert rig.parts.capacity is not None and rig.parts.capacity.held == 0


@pytest.mark.parametrize("dry_run", [False, True], ids=["enforcing", "dry_run"])
async def test_pipeline_and_chain_shed_with_limit_alike(dry_run: bool) -> None:
    """No queue and no free permit: the same ``limit`` shed, with or without a body."""
    config = {**BASE, "load_shed_dry_run": dry_run, "admission_queue": {"enabled": False}}
    script: list[Step] = [_hold_permits, _get(), _post(b"body"), _release_permits, _get()]
    fused, chain = _rig(config, pipeline=True), _rig(config, pipeline=False)
    assert await _play(fused, script) == await _play(chain, script)
    assert fused.upstream == chain.upstream and _counters(fused) == _counters(chain)
    if not dry_run:
        assert [(t[2], t[3][0]) for t in fused.transcript] == [
            (429, "limit"), (429, "limit"), (200, None)]  # fmt: skip
    assert fused.parts.limiter.inflight == chain.parts.limiter.inflight == 0


@pytest.mark.parametrize("dry_run", [False, True], ids=["enforcing", "dry_run"])
async def test_pipeline_and_chain_rate_limit_alike(dry_run: bool) -> None:
    """A key over its rate: the same 429 with the same IETF headers, and the same admissions."""
    config = {
        **BASE,
        "load_shed_dry_run": dry_run,
        "rate_limit": {"enabled": True, "rate_per_s": 0.5, "burst": 1},
    }
    script: list[Step] = [_get(), _get(), _post(b"body")]
    fused, chain = _rig(config, pipeline=True), _rig(config, pipeline=False)
    assert await _play(fused, script) == await _play(chain, script)
    assert fused.upstream == chain.upstream and _counters(fused) == _counters(chain)
    if not dry_run:
        assert [t[2] for t in fused.transcript] == [200, 429, 429]
        assert fused.transcript[1][3][0] == "rate_limited"
