"""Cost of the JSON access log wrapper: a trivial ASGI app with and without it.

Run: .venv/bin/python deploy/measure_access_log.py (median of 5 runs of 20,000
requests each; numbers in docs/deploy.md, "Access log").
"""

from __future__ import annotations

import asyncio
import io
import statistics
import time
from typing import Any

from ballast_asgi.ops.access_log import AccessLog


class _Sink(io.TextIOBase):
    """A stream that drops what it is given (like /dev/null, without a file)."""

    def write(self, text: str) -> int:
        return len(text)


async def app(scope: Any, receive: Any, send: Any) -> None:
    """The cheapest possible ASGI app."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def per_request_us(target: Any, n: int) -> float:
    """Microseconds per request of ``target`` over ``n`` requests."""
    scope = {"type": "http", "method": "GET", "path": "/api/x", "headers": [],
             "client": ("127.0.0.1", 1)}  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        return None

    started = time.perf_counter()
    for _ in range(n):
        await target(scope, receive, send)
    return (time.perf_counter() - started) / n * 1e6


async def main() -> None:
    """Alternate bare and logged runs; print the medians and the difference."""
    logged = AccessLog(AccessLog.inner(app), classify=lambda s: "standard", stream=_Sink())
    off: list[float] = []
    on: list[float] = []
    for _ in range(5):
        off.append(await per_request_us(app, 20_000))
        on.append(await per_request_us(logged, 20_000))
    bare, with_log = statistics.median(off), statistics.median(on)
    print(f"bare {bare:.2f} us/request; with the access log {with_log:.2f}; "
          f"added {with_log - bare:.2f} us")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
