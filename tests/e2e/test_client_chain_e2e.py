"""Two real services on loopback, install() on both, A calling B through BallastTransport."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from ballast_asgi import install
from ballast_asgi.client import BallastTransport, LocalRefusal
from tests.e2e.servers import serving


class ServiceB:
    """The downstream: counts arrivals at its door, records handled requests, answers ``status``."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.seen: list[dict[str, str]] = []
        self.arrived = 0
        self.port = 0
        self.status = 200
        self.inner = Starlette(routes=[Route("/work", self.work)])
        install(self.inner, config)

    async def app(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.arrived += 1
        await self.inner(scope, receive, send)

    async def work(self, request: Request) -> Response:
        self.seen.append(dict(request.headers))
        return Response("b", status_code=self.status)


def service_a(b_port: int, config: dict[str, Any] | None = None) -> FastAPI:
    """The upstream: a FastAPI app that spends ``?spend_ms`` then calls B once."""
    client = httpx.AsyncClient(transport=BallastTransport(), base_url=f"http://127.0.0.1:{b_port}")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()  # its pool's connections belong to this server's loop

    app = FastAPI(lifespan=lifespan)
    install(app, config)

    @app.get("/call")
    async def call(spend_ms: float = 0.0) -> dict[str, Any]:
        await asyncio.sleep(spend_ms / 1000.0)  # the handler's own work before the call
        try:
            response = await client.get("/work")
        except LocalRefusal as exc:
            return {"refused": type(exc).__name__}
        return {"status": response.status_code}

    return app


@pytest.fixture
def chain(request: pytest.FixtureRequest) -> Iterator[tuple[ServiceB, str]]:
    """B and A on loopback; yields B and A's base URL."""
    b_config, a_config = getattr(request, "param", (None, None))
    b = ServiceB(b_config)
    with (
        serving(b.app, interface="asgi3") as b_port,
        serving(service_a(b_port, a_config)) as a_port,
    ):
        b.port = b_port
        yield b, f"http://127.0.0.1:{a_port}"


def test_downstream_sees_reduced_deadline_and_callers_priority(chain: Any) -> None:
    """B gets X-Deadline-Ms reduced by A's elapsed time and the caller's X-Priority."""
    b, a = chain
    headers = {"X-Deadline-Ms": "3000", "X-Priority": "0"}  # B's own admission says "critical"
    answer = httpx.get(f"{a}/call", params={"spend_ms": 100}, headers=headers, timeout=10)
    assert answer.json() == {"status": 200}
    assert b.seen[0]["x-priority"] == "critical"
    assert 0 < int(b.seen[0]["x-deadline-ms"]) <= 2900


def test_no_budget_left_is_never_sent(chain: Any) -> None:
    """A call made after the caller's budget is spent is refused in A; B sees nothing."""
    b, a = chain
    answer = httpx.get(f"{a}/call", params={"spend_ms": 80},
                       headers={"X-Deadline-Ms": "40"}, timeout=10)  # fmt: skip
    assert answer.status_code == 504  # A's own handler stage: the deadline passed
    assert b.seen == []


_NO_CANCEL = {"admission": {"cancel_on_deadline": False}}


@pytest.mark.parametrize("chain", [(None, _NO_CANCEL)], indirect=True)
def test_no_budget_call_raises_in_the_handler(chain: Any) -> None:
    """With A's handlers allowed past their deadline, the late call raises DeadlineExceeded."""
    b, a = chain
    answer = httpx.get(f"{a}/call", params={"spend_ms": 80},
                       headers={"X-Deadline-Ms": "40"}, timeout=10)  # fmt: skip
    assert answer.json() == {"refused": "DeadlineExceeded"}
    assert b.seen == []


_B_SHEDS = {"rate_limit": {"enabled": True, "key": "route", "rate_per_s": 0.01, "burst": 1}}


@pytest.mark.parametrize("chain", [(_B_SHEDS, None)], indirect=True)
def test_downstream_shed_is_not_retried(chain: Any) -> None:
    """B's ballast shed (429 rate_limited) reaches A once; then A backs off for Retry-After."""
    b, a = chain
    first = httpx.get(f"{a}/call", timeout=10).json()
    second = httpx.get(f"{a}/call", timeout=10).json()
    third = httpx.get(f"{a}/call", timeout=10).json()
    assert (first, second, third) == ({"status": 200}, {"status": 429}, {"refused": "Throttled"})
    assert len(b.seen) == 1  # the shed request never reached B's handler, and was sent once
    metrics = httpx.get(f"{a}/_ballast/metrics", timeout=10).text
    host = f"http://127.0.0.1:{b.port}"
    for event, count in (("sent", 2), ("shed", 1), ("retried", 0), ("backed_off", 1)):
        assert f'ballast_client_calls_total{{event="{event}",host="{host}"}} {count}.0' in metrics


def test_failing_downstream_gets_originals_plus_budget(chain: Any) -> None:
    """B failing every call with 503: B's attempts stay within originals + retry budget."""
    b, a = chain
    b.status = 503
    originals = 40
    with httpx.Client(timeout=10) as client:
        for _ in range(originals):
            client.get(f"{a}/call")
    assert 1 <= b.arrived <= originals + 0.1 * originals + 1  # throttle and back-off send fewer
    host = f"http://127.0.0.1:{b.port}"
    metrics = httpx.get(f"{a}/_ballast/metrics", timeout=10).text
    assert f'ballast_client_calls_total{{event="sent",host="{host}"}} {b.arrived}.0' in metrics
    budget = httpx.get(f"{a}/_ballast/snapshot", timeout=10).json()["client"]["hosts"][host][
        "retry_budget"
    ]
    sent, retries = budget["originals_in_window"], budget["retries_in_window"]
    assert sent <= b.arrived <= sent + retries  # a granted retry may still be throttled
    assert retries <= 0.1 * sent + 1  # ... and the retries stay within the budget
    assert budget["allowance"] == pytest.approx(0.1 * sent + 1)
