"""The admin port of ``ballast --workers N``: one answer from every worker's (adapter).

The supervisor (``ballast_asgi.server.supervisor``) keeps one ``Slot`` per worker
position; ``Aggregator`` asks each live worker on its Unix socket and merges
the answers (``ballast_asgi.server.workers.merge_metrics``), saying which worker is
missing instead of refusing the whole answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from ballast_asgi.core.types import Receive, Scope, Send
from ballast_asgi.middleware.responses import send_json
from ballast_asgi.ops.admin import empty_lifespan
from ballast_asgi.server.workers import merge_metrics

__all__ = ["Aggregator", "Slot"]

#: How long the admin port waits for a worker's answer (one still starting: less).
ASK_S = 5.0
STARTING_ASK_S = 0.5


@dataclass
class Slot:
    """One worker position: its current process, and its restart record."""

    index: int
    path: str
    pid: int | None = None
    state: str = "starting"  # starting (until it answers), running, restarting, given_up, exited
    restarts: list[float] = field(default_factory=list)
    last_exit: str | None = None

    def describe(self) -> dict[str, Any]:
        """The snapshot's entry for a missing worker."""
        return {"index": self.index, "pid": self.pid, "state": self.state,
                "last_exit": self.last_exit, "restarts": len(self.restarts)}  # fmt: skip


class Aggregator:
    """The admin-port app of the parent: metrics, snapshot and health over every worker."""

    def __init__(self, slots: list[Slot]) -> None:
        self.slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await empty_lifespan(receive, send)
            return
        path = scope["path"].rstrip("/") or "/"
        if scope["type"] != "http" or path not in ("/metrics", "/snapshot", "/health"):
            await send_json(send, 404, {"error": "not_found"})
            return
        auth = [(k, v) for k, v in scope["headers"] if k == b"authorization"]
        answers = await asyncio.gather(*(self._ask(s, path, auth) for s in self.slots))
        denied = next((a for a in answers if a[0] in (401, 403)), None)
        if denied is not None and path != "/health":  # the admin token is checked by workers
            await send_json(send, denied[0], json.loads(denied[1] or "{}"))
            return
        live = [(s, a) for s, a in zip(self.slots, answers, strict=True) if a[0] == 200]
        missing = [s for s, a in zip(self.slots, answers, strict=True) if a[0] != 200]
        if path == "/metrics":
            await _send_text(send, merge_metrics(a[1] for _, a in live) + self._own_metrics(live))
        elif path == "/snapshot":
            doc: dict[str, object] = {"workers": [json.loads(a[1]) for _, a in live],
                                      "missing": [s.describe() for s in missing]}  # fmt: skip
            await send_json(send, 200, doc)
        else:
            await self._health(send, answers, missing)

    async def _health(
        self, send: Send, answers: list[tuple[int, str]], missing: list[Slot]
    ) -> None:
        docs = [_json(text) for _, text in answers]
        draining = next((d for d in docs if d.get("status") == "draining"), None)
        if draining is not None:  # a graceful shutdown began: load balancers must see it
            await send_json(send, 503, draining)
            return
        if len(missing) == len(answers):
            gone = [s.describe() for s in missing]
            await send_json(send, 503, {"status": "down", "missing": gone})
            return
        reasons = [r for d in docs for r in d.get("reasons", [])]
        reasons += [f"workers: worker {s.index} missing ({s.state}, last {s.last_exit})"
                    for s in missing]  # fmt: skip
        body: dict[str, Any] = {"status": "degraded", "reasons": sorted(set(reasons))}
        await send_json(send, 200, body if reasons else {"status": "ok"})

    def _own_metrics(self, live: list[tuple[Slot, tuple[int, str]]]) -> str:
        up = {s.index for s, _ in live}
        lines = ["# HELP ballast_worker_up 1 when the worker answered the admin port.",
                 "# TYPE ballast_worker_up gauge"]  # fmt: skip
        lines += [f'ballast_worker_up{{worker="{s.index}"}} {int(s.index in up)}'
                  for s in self.slots]  # fmt: skip
        lines += ["# HELP ballast_worker_restarts_total Restarts of the worker by the supervisor.",
                  "# TYPE ballast_worker_restarts_total counter"]  # fmt: skip
        lines += [f'ballast_worker_restarts_total{{worker="{s.index}"}} {len(s.restarts)}'
                  for s in self.slots]  # fmt: skip
        return "\n".join(lines) + "\n"

    async def _ask(self, slot: Slot, path: str, auth: list[tuple[bytes, bytes]]) -> tuple[int, str]:
        if slot.state not in ("running", "starting"):
            return 503, ""
        transport = httpx.AsyncHTTPTransport(uds=slot.path)
        # A worker still starting gets a short wait: the others' answers must not hang on it.
        timeout = STARTING_ASK_S if slot.state == "starting" else ASK_S
        try:
            async with httpx.AsyncClient(transport=transport, timeout=timeout) as client:
                r = await client.get(f"http://worker{path}", headers=auth)
        except httpx.TransportError:
            return 503, ""
        if slot.state == "starting" and r.status_code < 500:
            slot.state = "running"
        return r.status_code, r.text


def _json(text: str) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        doc = json.loads(text)
        if isinstance(doc, dict):
            return doc
    return {}


async def _send_text(send: Send, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
