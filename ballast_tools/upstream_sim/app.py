"""The simulator's two ASGI apps: raw-ASGI traffic, Starlette admin.

Traffic (any method, any path): the request joins the FIFO queue of its path
class (``Profile.paths``, matched by prefix; the default pool otherwise),
waits for a worker (an ``asyncio.Future`` handed over by the worker that frees
up), holds it for its service time (``asyncio.sleep``: the simulated work),
and gets ``200 ok`` or ``error_status``. With ``drop_expired`` a request whose
``X-Deadline-Ms`` passed while it queued gets ``504`` without service.

Admin: ``GET /profile``, ``POST /profile`` (partial JSON update, applied
live), ``GET /stats``, ``POST /stats/reset``, ``GET /health``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from ballast_asgi.core.types import Receive, Scope, Send
from ballast_asgi.ops.admin import empty_lifespan
from ballast_tools.upstream_sim.model import Service, Simulator
from ballast_tools.upstream_sim.profile_api import ProfileUpdate, apply_update, profile_to_dict

Waiter = asyncio.Future[None]

_DEADLINE = b"x-deadline-ms"
_TEXT = (b"content-type", b"text/plain")
_BODIES = {200: b"ok\n", 504: b"expired\n"}


def _deadline_s(scope: Scope, now: float) -> float | None:
    """Absolute deadline from ``X-Deadline-Ms`` (malformed values are ignored)."""
    for name, value in scope["headers"]:
        if name == _DEADLINE:
            try:
                return now + float(value) / 1000.0
            except ValueError:
                return None
    return None


class TrafficApp:
    """Raw ASGI app: queue for a worker, hold it for the service time, answer."""

    def __init__(
        self, sim: Simulator[Waiter], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sim = sim
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await empty_lifespan(receive, send)
            return
        arrived = self.clock()
        deadline = _deadline_s(scope, arrived)
        cls = self.sim.classify(scope.get("path") or "/")
        await self._wait_for_worker(cls)
        service = self.sim.begin(arrived, deadline, self.clock(), cls)
        try:
            if service.duration_s > 0:
                await asyncio.sleep(service.duration_s)
        except BaseException:
            self.hand_over(self.sim.release(cls), cls)
            raise
        self.hand_over(self.sim.end(service, deadline, self.clock(), cls), cls)
        await self._respond(send, service)

    async def _wait_for_worker(self, cls: int = -1) -> None:
        waiter: Waiter = asyncio.get_running_loop().create_future()
        if self.sim.arrive(waiter, cls):
            return
        try:
            await waiter
        except asyncio.CancelledError:
            if not self.sim.cancel(waiter) and waiter.done() and not waiter.cancelled():
                self.hand_over(self.sim.release(cls), cls)  # granted a worker we will not use
            raise

    def hand_over(self, waiter: Waiter | None, cls: int = -1) -> None:
        """Give a freed worker (of path class ``cls``) to ``waiter``, skipping cancelled ones."""
        while waiter is not None:
            if not waiter.done():
                waiter.set_result(None)
                return
            waiter = self.sim.release(cls)

    async def _respond(self, send: Send, service: Service) -> None:
        if service.expired:
            status = 504
        elif service.error:
            status = self.sim.profile.error_status
        else:
            status = 200
        body = _BODIES.get(status, b"error\n")
        headers = [_TEXT, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _error(status: int, message: str, fields: list[dict[str, str]] | None = None) -> JSONResponse:
    content: dict[str, Any] = {"error": message}
    if fields is not None:
        content["fields"] = fields
    return JSONResponse(content, status_code=status)


def _fields(exc: ValidationError) -> list[dict[str, str]]:
    out = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(body)"
        out.append({"field": field, "problem": err["msg"]})
    return out


def build_admin_app(
    traffic: TrafficApp, *, clock: Callable[[], float] = time.monotonic
) -> Starlette:
    """The admin app for ``traffic``'s simulator."""
    sim = traffic.sim
    started = clock()

    async def get_profile(request: Request) -> JSONResponse:
        return JSONResponse(profile_to_dict(sim.profile))

    async def post_profile(request: Request) -> JSONResponse:
        try:
            data = json.loads(await request.body() or b"{}")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"body is not valid JSON: {exc}")
        if not isinstance(data, dict):
            return _error(400, "body must be a JSON object")
        try:
            profile = apply_update(sim.profile, ProfileUpdate.model_validate(data))
        except ValidationError as exc:
            return _error(422, "invalid profile", _fields(exc))
        for waiter, cls in sim.set_profile_classes(profile):
            traffic.hand_over(waiter, cls)
        return JSONResponse(profile_to_dict(profile))

    async def get_stats(request: Request) -> JSONResponse:
        out = sim.snapshot()
        out.update(cpu_s=round(time.process_time(), 3), uptime_s=round(clock() - started, 3))
        return JSONResponse(out)

    async def reset_stats(request: Request) -> JSONResponse:
        sim.reset_stats()
        return JSONResponse(sim.snapshot())

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[
            Route("/profile", get_profile, methods=["GET"]),
            Route("/profile", post_profile, methods=["POST"]),
            Route("/stats", get_stats, methods=["GET"]),
            Route("/stats/reset", reset_stats, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )
