"""Dry-run (``load_shed_dry_run``): every would-be shed is admitted and counted instead.

The core check drives the same scripted sequence of requests through the real
stack (``stack.build_stack``) once enforcing and once in dry-run, and asserts
the multiset of ``(reason, priority)`` in ``ballast_shed_total`` (enforcing)
equals the one in ``ballast_dry_run_shed_total`` (dry-run). The inner app
holds ``/hold/*`` requests open until the test releases them, so the order of
events is fixed; the only timers are the queue's own expiry timers, and every
wait on them is an event wait bounded by a timeout.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from ballast_asgi.config import GatewayConfig, build_config
from ballast_asgi.core.types import Receive, Scope, Send
from ballast_asgi.gateway import build_gateway
from ballast_asgi.gateway.stack import Parts, build_parts, build_stack
from ballast_asgi.middleware.context import RequestContext, find_context
from ballast_asgi.telemetry.metrics import Metrics, null_metrics
from tests.fakes import until

pytestmark = pytest.mark.anyio

WAIT_S = 5.0  # upper bound of any single wait; never reached when the code is right


class Inner:
    """Scripted inner app: ``/hold/*`` waits for ``release``; ``/fail`` is a 500; else 200."""

    def __init__(self) -> None:
        self.arrived: dict[str, asyncio.Event] = {}
        self.gates: dict[str, asyncio.Event] = {}
        self.contexts: dict[str, RequestContext | None] = {}

    def _event(self, table: dict[str, asyncio.Event], path: str) -> asyncio.Event:
        return table.setdefault(path, asyncio.Event())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        self.contexts[path] = find_context(scope)
        self._event(self.arrived, path).set()
        if path.startswith("/hold/"):
            await asyncio.wait_for(self._event(self.gates, path).wait(), WAIT_S)
        status = 500 if path == "/fail" else 200
        headers = [(b"x-inner", b"1")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": path.encode()})

    def release(self, path: str) -> None:
        self._event(self.gates, path).set()

    def has_arrived(self, path: str) -> bool:
        return path in self.arrived and self.arrived[path].is_set()


class Driver:
    """One stack over a fixed limiter, driven request by request."""

    def __init__(self, config: GatewayConfig) -> None:
        self.metrics: Metrics = null_metrics()
        self.parts: Parts = build_parts(config, self.metrics)
        self.inner = Inner()
        self.app = build_stack(self.inner, self.parts, config, retries=False)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://gw"
        )
        self.tasks: dict[str, asyncio.Task[httpx.Response]] = {}

    def send(self, path: str, **headers: str) -> asyncio.Task[httpx.Response]:
        hdrs = {k.replace("_", "-"): v for k, v in headers.items()}
        task = asyncio.ensure_future(self.client.get(path, headers=hdrs))
        self.tasks[path] = task
        return task

    async def settle(self, path: str) -> None:
        """Wait until ``path`` was answered or reached the inner app (bounded)."""
        task = self.tasks[path]
        arrival = asyncio.ensure_future(self.inner._event(self.inner.arrived, path).wait())
        try:
            await asyncio.wait({task, arrival}, timeout=WAIT_S, return_when="FIRST_COMPLETED")
        finally:
            arrival.cancel()
        assert task.done() or self.inner.has_arrived(path), f"{path} never settled"

    async def queued(self, total: int) -> None:
        await until(lambda: self.parts.queue.total == total)

    async def release(self, path: str) -> httpx.Response:
        self.inner.release(path)
        return await asyncio.wait_for(self.tasks[path], WAIT_S)

    async def finish(self) -> dict[str, httpx.Response]:
        """Release every held request and collect every response."""
        for path in self.tasks:
            self.inner.release(path)
        done = await asyncio.wait_for(asyncio.gather(*self.tasks.values()), WAIT_S)
        await self.client.aclose()
        return dict(zip(self.tasks, done, strict=True))


def counts(metrics: Metrics, name: str) -> Counter[tuple[str, str]]:
    """The multiset of (reason, priority) in a ``{reason, priority}`` counter."""
    out: Counter[tuple[str, str]] = Counter()
    for family in metrics.registry.collect():
        for s in family.samples:
            if s.name == name and s.value:
                out[(s.labels["reason"], s.labels["priority"])] += int(s.value)
    return out


def config(dry_run: bool, **extra: Any) -> GatewayConfig:
    data: dict[str, Any] = {
        "max_concurrent_requests": 2,
        "load_shed_dry_run": dry_run,
        "limiter": {"algorithm": "fixed", "fixed_limit": 2},
        "admission_queue": {"enabled": True, "max_queue_size": 2, "per_priority": True},
        # One breaker any single failure opens (the script has one client and several routes).
        "breaker": {
            "consecutive_failures": 1,
            "open_ms": 60_000,
            "max_open_ms": 60_000,
            "scope": "global",
            "min_failing_clients": 1,
        },
    }
    for key, value in extra.items():
        section = data.get(key)
        data[key] = {**section, **value} if isinstance(section, dict) else value
    return build_config(data, require_upstream=False)


Script = Callable[[Driver], Awaitable[None]]


async def queue_and_breaker_script(d: Driver) -> None:
    """deadline, queue_full (refused and displaced), deadline in queue, breaker_open."""
    for path in ("/hold/a", "/hold/b"):  # take both permits
        d.send(path)
        await d.settle(path)
    d.send("/doa", X_Deadline_Ms="0", X_Priority="bulk")  # deadline at admission
    await d.settle("/doa")
    d.send("/hold/q1", X_Priority="bulk")  # queued in the shared half
    await d.queued(1)
    d.send("/q2", X_Priority="bulk")  # shared half full, nobody lower: queue_full
    await d.settle("/q2")
    d.send("/hold/q3", X_Priority="standard")  # displaces q1: queue_full (bulk)
    await d.settle("/hold/q1")
    d.send("/hold/c", X_Priority="critical")  # critical uses the reserved half
    await d.queued(2)
    d.send("/late", X_Priority="critical", X_Deadline_Ms="5")  # displaces q3, then expires
    await d.settle("/hold/q3")
    await d.settle("/late")
    await d.release("/hold/a")  # the freed permit goes to the critical waiter
    await d.settle("/hold/c")
    await d.release("/hold/b")
    assert (await d.send("/fail")).status_code == 500  # opens the breaker
    for path in ("/hold/open1", "/hold/open2", "/hold/open3"):  # breaker_open, each
        d.send(path)
        await d.settle(path)


async def queue_timeout_script(d: Driver) -> None:
    """A waiter whose queue timeout passes before a permit frees."""
    for path in ("/hold/a", "/hold/b"):
        d.send(path)
        await d.settle(path)
    d.send("/wait", X_Priority="standard")
    await d.settle("/wait")


async def limit_script(d: Driver) -> None:
    """Without a queue, a request over the limit."""
    for path in ("/hold/a", "/hold/b"):
        d.send(path)
        await d.settle(path)
    d.send("/over", X_Priority="bulk")
    await d.settle("/over")


SCENARIOS: list[tuple[Script, dict[str, Any], Counter[tuple[str, str]]]] = [
    (
        queue_and_breaker_script,
        {},
        Counter(
            {
                ("deadline", "bulk"): 1,
                ("queue_full", "bulk"): 2,
                ("queue_full", "standard"): 1,
                ("deadline", "critical"): 1,
                ("breaker_open", "standard"): 3,
            }
        ),
    ),
    (
        queue_timeout_script,
        {"admission_queue": {"queue_timeout_ms": 5}},
        Counter({("queue_timeout", "standard"): 1}),
    ),
    (limit_script, {"admission_queue": {"enabled": False}}, Counter({("limit", "bulk"): 1})),
]


@pytest.mark.parametrize(("script", "extra", "expected"), SCENARIOS)
async def test_dry_run_counts_equal_enforced_sheds(
    script: Script, extra: dict[str, Any], expected: Counter[tuple[str, str]]
) -> None:
    """The same scripted sequence: dry-run counts exactly what enforcement sheds."""
    enforced = Driver(config(False, **extra))
    await script(enforced)
    enforced_responses = await enforced.finish()
    dry = Driver(config(True, **extra))
    await script(dry)
    dry_responses = await dry.finish()

    assert counts(enforced.metrics, "ballast_shed_total") == expected
    assert counts(enforced.metrics, "ballast_dry_run_shed_total") == Counter()
    assert counts(dry.metrics, "ballast_dry_run_shed_total") == expected
    assert counts(dry.metrics, "ballast_shed_total") == Counter()
    shed = [p for p, r in enforced_responses.items() if "x-ballast-reason" in r.headers]
    assert len(shed) == sum(expected.values())
    for path, resp in dry_responses.items():
        assert resp.headers.get("x-inner") == "1", f"{path} did not reach the inner app"
        assert resp.status_code == (500 if path == "/fail" else 200)
    for drv in (enforced, dry):
        assert drv.parts.limiter.inflight == 0 and drv.parts.limiter.double_releases == 0
        assert drv.parts.queue.total == 0
        assert drv.parts.capacity is not None and drv.parts.capacity.held == 0


async def test_would_shed_reason_is_noted_once_on_the_context() -> None:
    """A dry-run admitted request carries its (single) would-be reason on its context."""
    d = Driver(config(True))
    d.send("/doa", X_Deadline_Ms="0")
    await d.settle("/doa")
    await d.finish()
    ctx = d.inner.contexts["/doa"]
    assert ctx is not None and [r.value for r in ctx.would_shed] == ["deadline"]
    assert ctx.permit is None and ctx.shed_reason is None


async def test_dry_run_request_over_the_limit_holds_no_permit() -> None:
    """Admitted over the limit: in-flight stays at the limit and drops to 0 without
    a double release, whichever finishes first."""
    d = Driver(config(True, admission_queue={"enabled": False}))
    for path in ("/hold/a", "/hold/b", "/hold/c"):
        d.send(path)
        await d.settle(path)
    assert d.inner.has_arrived("/hold/c")
    assert d.parts.limiter.inflight == 2
    await d.release("/hold/c")  # the permit-less one first
    assert d.parts.limiter.inflight == 2
    await d.finish()
    assert d.parts.limiter.inflight == 0 and d.parts.limiter.double_releases == 0


async def test_malformed_header_is_still_a_400_in_dry_run() -> None:
    """Dry-run admits sheds, not malformed requests: a bad header is still a 400."""
    d = Driver(config(True))
    resp = await d.client.get("/x", headers={"X-Deadline-Ms": "soon"})
    await d.client.aclose()
    assert resp.status_code == 400
    assert counts(d.metrics, "ballast_dry_run_shed_total") == Counter()


async def test_capacity_over_cap_is_admitted_without_entering() -> None:
    """Over the held-requests cap, dry-run admits without taking a capacity slot."""
    d = Driver(config(True, capacity={"max_held_requests": 1, "reserved_fraction": 0.0}))
    d.send("/hold/a")
    await d.settle("/hold/a")
    d.send("/b")
    await d.settle("/b")
    assert d.parts.capacity is not None and d.parts.capacity.held == 1
    await d.finish()
    assert d.parts.capacity.held == 0
    assert counts(d.metrics, "ballast_dry_run_shed_total") == Counter({("capacity", "standard"): 1})


async def test_flag_is_read_live_from_the_responder() -> None:
    """Flipping ``responder.dry_run`` changes the next request's fate, no rebuild."""
    d = Driver(config(False))
    assert (await d.client.get("/x", headers={"X-Deadline-Ms": "0"})).status_code == 429
    d.parts.responder.dry_run = True
    assert (await d.client.get("/y", headers={"X-Deadline-Ms": "0"})).status_code == 200
    await d.client.aclose()
    assert counts(d.metrics, "ballast_shed_total") == Counter({("deadline", "standard"): 1})
    assert counts(d.metrics, "ballast_dry_run_shed_total") == Counter({("deadline", "standard"): 1})


async def test_gateway_forwards_dead_on_arrival_with_zero_deadline() -> None:
    """Through the proxy, a dead-on-arrival request dry-run admits goes upstream with
    X-Deadline-Ms 0; the snapshot shows dry-run on and the would-be count."""
    seen: list[str] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("x-deadline-ms", ""))
        return httpx.Response(200, text="ok")

    cfg = build_config({"upstream": "http://up.test", "load_shed_dry_run": True})
    gw = build_gateway(cfg, transport=httpx.MockTransport(upstream), env={})
    transport = httpx.ASGITransport(app=gw)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        resp = await c.get("/x", headers={"X-Deadline-Ms": "0", "X-Priority": "bulk"})
        snap = (await c.get("/_ballast/snapshot")).json()
    assert resp.status_code == 200 and seen == ["0"]
    assert snap["config"]["dry_run"] is True
    assert snap["dry_run"] == {"enabled": True, "would_shed": {"deadline": {"bulk": 1.0}}}
    assert snap["shed"] == {}
