"""A small FastAPI app protected by the ballast stack.

Run it with ``.venv/bin/uvicorn examples.fastapi_app:app --port 8000`` and try::

    curl -s localhost:8000/orders/7 -H 'X-Priority: critical' -H 'X-Deadline-Ms: 400'
    curl -s localhost:8000/_ballast/snapshot
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request

import ballast_asgi

app = FastAPI(title="orders")


@app.get("/orders/{order_id}")
async def order(order_id: int, request: Request) -> dict[str, object]:
    """Pretend to look an order up; report what ballast knew about the request."""
    await asyncio.sleep(0.005)
    ctx = request.state.ballast
    return {"order_id": order_id, "priority": ctx.priority.label, "queued_s": ctx.queue_wait_s}


@app.post("/reports")
async def report() -> dict[str, str]:
    """A slow bulk endpoint; classified as bulk by the rule below."""
    await asyncio.sleep(0.05)
    return {"status": "done"}


parts = ballast_asgi.install(
    app,
    {
        "max_concurrent_requests": 64,
        "limiter": {"algorithm": "gradient", "initial_limit": 16},
        "priority": {"rules": [{"path": "/reports", "methods": ["POST"], "priority": "bulk"}]},
    },
)
