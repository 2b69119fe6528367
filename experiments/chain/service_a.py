"""Service A: a FastAPI app whose one route calls service B, in the three configurations.

* ``naive``: no ballast; B is called with ``naive_call`` (3 attempts of 1 s
  each, tenacity-style waits) through a plain ``httpx.AsyncClient``;
* ``server``: the same call, but the app is protected by ``install()``
  (deadline admission, queue, adaptive limit; the handler is cancelled when
  its deadline passes);
* ``both``: ``install()`` and ``httpx.AsyncClient(transport=BallastTransport())``,
  one call: the transport forwards the remaining budget and the tier,
  throttles itself and retries within its budget; a refused call becomes a
  429 shed (``refusal_handler``).

Every configuration copies the client's measurement-only ``X-Chain-Give-Up``
and ``X-Chain-Id`` to B, and the naive loops add ``X-Chain-Attempt-Give-Up`` (their own
timeout): B's record of wasted work reads them, nothing else does.

    python -m experiments.chain.service_a --port P --b http://127.0.0.1:Q --mode both
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response

from ballast_asgi import install
from ballast_asgi.client import BallastTransport, LocalRefusal, refusal_handler
from experiments.chain.naive import TIMEOUT_S, naive_call

MODES = ("naive", "server", "both")
_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=512)


def build_app(b_url: str, mode: str, seed: int = 1) -> FastAPI:
    """Service A in ``mode`` calling ``b_url``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    transport = (
        BallastTransport(httpx.AsyncHTTPTransport(limits=_LIMITS)) if mode == "both" else None
    )
    client = httpx.AsyncClient(base_url=b_url, transport=transport, limits=_LIMITS)
    rng = random.Random(seed)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(lifespan=lifespan)
    if mode != "naive":
        install(app)
    if mode == "both":
        app.add_exception_handler(LocalRefusal, refusal_handler)

    @app.get("/work")
    async def work(request: Request) -> Response:
        tags = {"X-Chain-Give-Up": request.headers.get("x-chain-give-up", ""),
                "X-Chain-Id": request.headers.get("x-chain-id", "")}  # fmt: skip
        if mode == "both":
            return await _call_once(client, tags)

        async def attempt() -> int:
            headers = {**tags, "X-Chain-Attempt-Give-Up": f"{time.time() + TIMEOUT_S:.6f}"}
            return (await client.get("/work", headers=headers, timeout=TIMEOUT_S)).status_code

        status = await naive_call(attempt, rng=rng)
        return Response(status_code=200 if status == 200 else 502)

    return app


async def _call_once(client: httpx.AsyncClient, tags: dict[str, str]) -> Response:
    """One call; a refusal propagates to ``refusal_handler`` (a 429 shed upstream)."""
    try:
        answer = await client.get("/work", headers=tags)
    except LocalRefusal:
        raise
    except httpx.TransportError:
        return Response(status_code=502)
    return Response(status_code=answer.status_code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--b", required=True)
    parser.add_argument("--mode", choices=MODES, required=True)
    args = parser.parse_args()
    uvicorn.run(build_app(args.b, args.mode), host="127.0.0.1", port=args.port,
                log_level="warning", backlog=4096)  # fmt: skip


if __name__ == "__main__":
    main()
