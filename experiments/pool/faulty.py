"""A tiny upstream instance with switchable faults, for the pool experiment.

    python -m experiments.pool.faulty --port 9201 [--median-ms 10 --sigma 0.5]
        [--error-rate 0.0 --seed 1]

Every request (any path, ``/health`` included) waits a log-normal delay
(median ``median_ms``, shape ``sigma``) and answers ``200`` with a small body,
or ``500`` with probability ``error_rate``. ``POST /_fault/<mode>`` switches
the fault live (answered at once, never faulted):

- ``ok``: no fault;
- ``503``: every request answers 503 at once;
- ``reset``: the response head (200, Content-Length 64) and 16 bytes are sent,
  then the connection is dropped (a reset mid-response);
- ``brownout``: half the requests answer 503 at once;
- ``slow``: the delay is ten times longer.

Hard down (connection refused) is the experiment stopping the process.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
from collections.abc import Sequence
from typing import Any

import uvicorn

MODES = ("ok", "503", "reset", "brownout", "slow")
_BODY = b"x" * 64


class _Abort(Exception):
    """Raised after a partial body: uvicorn drops the connection."""


class FaultyApp:
    """The raw ASGI app (state: the current mode; seeded randomness)."""

    def __init__(self, median_ms: float, sigma: float, error_rate: float, seed: int) -> None:
        self.mu = math.log(median_ms / 1000.0)
        self.sigma = sigma
        self.error_rate = error_rate
        self.rng = random.Random(seed)
        self.mode = "ok"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        if path.startswith("/_fault/") and scope["method"] == "POST":
            await self._switch(path.removeprefix("/_fault/"), send)
            return
        await self._serve(send)

    async def _switch(self, mode: str, send: Any) -> None:
        ok = mode in MODES
        if ok:
            self.mode = mode
        await _respond(send, 200 if ok else 404, mode.encode() if ok else b"unknown mode")

    async def _serve(self, send: Any) -> None:
        mode = self.mode
        if mode == "503" or (mode == "brownout" and self.rng.random() < 0.5):
            await _respond(send, 503, b"unavailable")
            return
        delay = self.rng.lognormvariate(self.mu, self.sigma) * (10.0 if mode == "slow" else 1.0)
        await asyncio.sleep(delay)
        if mode == "reset":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"64")]})  # fmt: skip
            await send({"type": "http.response.body", "body": _BODY[:16], "more_body": True})
            raise _Abort
        error = self.error_rate > 0 and self.rng.random() < self.error_rate
        await _respond(send, 500 if error else 200, b"error" if error else _BODY)


async def _respond(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def main(argv: Sequence[str] | None = None) -> int:
    """Serve one instance until SIGTERM."""
    p = argparse.ArgumentParser(prog="python -m experiments.pool.faulty")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--median-ms", type=float, default=10.0)
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    app = FaultyApp(args.median_ms, args.sigma, args.error_rate, args.seed)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="critical", lifespan="off",
                access_log=False)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
