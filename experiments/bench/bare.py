"""Bare pass-through proxies for ``make bench`` (the floor a Python gateway can reach).

A raw ASGI callable on uvicorn (uvloop, httptools, no framework) that reads the
request body, sends the request upstream through ONE shared client, and writes
the whole response back: ``--client aiohttp`` (one ``ClientSession``) or
``--client httpx`` (one plain ``httpx.AsyncClient``, default pool). Hop-by-hop
headers are dropped both ways; nothing else is done (no deadlines, no limits,
no metrics). ``backend`` is the 1 KB fallback upstream when nginx is missing.

    python -m experiments.bench.bare proxy --client aiohttp --upstream URL --port P
    python -m experiments.bench.bare backend --port P
"""

from __future__ import annotations

import argparse
from typing import Any

HOP = frozenset(
    b"connection keep-alive proxy-authenticate proxy-authorization te trailer "
    b"transfer-encoding upgrade host content-length".split()
)

Scope = dict[str, Any]


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)


async def _lifespan(receive: Any, send: Any, startup: Any, shutdown: Any) -> None:
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await startup()
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


def _target(upstream: str, scope: Scope) -> str:
    query = scope.get("query_string") or b""
    path: str = scope["path"]
    return upstream + path + ("?" + query.decode() if query else "")


def _req_headers(scope: Scope) -> list[tuple[str, str]]:
    return [(k.decode(), v.decode()) for k, v in scope["headers"] if k not in HOP]


def aiohttp_app(upstream: str) -> Any:
    """The bare pass-through over one aiohttp ClientSession."""
    import aiohttp

    state: dict[str, aiohttp.ClientSession] = {}

    async def startup() -> None:
        state["s"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1000),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
        )

    async def shutdown() -> None:
        await state["s"].close()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, startup, shutdown)
            return
        body = await _body(receive)
        async with state["s"].request(
            scope["method"], _target(upstream, scope), headers=_req_headers(scope),
            data=body or None, allow_redirects=False,
        ) as r:  # fmt: skip
            data = await r.read()
            headers = [(k.lower(), v) for k, v in r.raw_headers if k.lower() not in HOP]
        headers.append((b"content-length", str(len(data)).encode()))
        await send({"type": "http.response.start", "status": r.status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    return app


def httpx_app(upstream: str) -> Any:
    """The bare pass-through over one plain httpx.AsyncClient (its own pool)."""
    import httpx

    state: dict[str, httpx.AsyncClient] = {}

    async def startup() -> None:
        state["c"] = httpx.AsyncClient(timeout=30.0)

    async def shutdown() -> None:
        await state["c"].aclose()

    async def app(scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, startup, shutdown)
            return
        body = await _body(receive)
        r = await state["c"].request(
            scope["method"], _target(upstream, scope), headers=_req_headers(scope), content=body
        )
        headers = [(k.lower(), v) for k, v in r.headers.raw if k.lower() not in HOP]
        headers.append((b"content-length", str(len(r.content)).encode()))
        await send({"type": "http.response.start", "status": r.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": r.content})

    return app


async def backend_app(scope: Scope, receive: Any, send: Any) -> None:
    """The fallback 1 KB upstream."""
    if scope["type"] != "http":
        return
    headers = [(b"content-type", b"application/octet-stream"), (b"content-length", b"1024")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"x" * 1024})


def main(argv: list[str] | None = None) -> None:
    """``proxy`` or ``backend`` child process."""
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m experiments.bench.bare")
    p.add_argument("role", choices=("proxy", "backend"))
    p.add_argument("--client", choices=("aiohttp", "httpx"), default="aiohttp")
    p.add_argument("--upstream", default="")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    make = aiohttp_app if args.client == "aiohttp" else httpx_app
    app = backend_app if args.role == "backend" else make(args.upstream.rstrip("/"))
    uvicorn.run(app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools",
                lifespan="off" if args.role == "backend" else "on", access_log=False,
                log_level="warning")  # fmt: skip


if __name__ == "__main__":
    main()
