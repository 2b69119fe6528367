"""In-process micro-benchmark of the gateway's hot path: CPU microseconds per request.

Drives ASGI apps directly with a synthetic uvicorn-like HTTP scope, ``receive``
and ``send`` (no server, no sockets on the client side), N requests per
repetition, and reports ``time.process_time`` per request (median over
repetitions; configurations alternate within each repetition).

``--mode fake`` (default): the terminal transport is an in-memory fake that
answers 200 + 1 KB at once, so what is measured is our own code: the stages,
the proxy and the httpx objects. Configurations, innermost first::

    proxy        ProxyApp alone
    admission    AdmissionMiddleware -> ProxyApp (the inner stages need its context)
    +breaker     + RetryMiddleware over BreakerMiddleware (retries on), inside admission
    +concurrency + ConcurrencyMiddleware
    +queue       + QueueMiddleware
    +capacity    + CapacityMiddleware (now the whole ``build_stack``)
    gateway      ``build_gateway``: the above + AdminRouter

``--mode real``: the real ``AiohttpTransport`` against nginx serving 1 KB on
127.0.0.1 (started here, stopped by PID; a raw asyncio server when nginx is
missing), ``--conc`` requests in flight; configurations ``bare-aiohttp`` (the
raw-ASGI pass-through of ``experiments.bench.bare``), ``proxy`` and
``gateway``. The upstream's CPU is in another process and not counted;
uvicorn's (the same for every configuration) is not included either, so the
ratio gateway / bare here is an upper bound of the ratio with a server.

    python -m experiments.hotpath --mode fake --n 20000 --reps 7
    python -m experiments.hotpath --mode real --n 5000 --reps 5 --conc 8
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from ballast_asgi.config import build_config
from ballast_asgi.core.classify import Classifier
from ballast_asgi.gateway import build_gateway
from ballast_asgi.gateway.stack import breaker_and_retry, build_parts
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.capacity import CapacityMiddleware
from ballast_asgi.middleware.concurrency import ConcurrencyMiddleware
from ballast_asgi.middleware.queueing import QueueMiddleware
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.transports.aiohttp_transport import AiohttpTransport
from ballast_asgi.telemetry.metrics import Metrics
from experiments._harness.procs import processes
from experiments._harness.servers import find_binary, start_nginx_backend

App = Callable[..., Any]
#: ``--only``: the configurations to run (e.g. under a profiler); empty = all.
ONLY: set[str] = set()
BODY_1K = b"x" * 1024
FIXED = {"limiter": {"algorithm": "fixed", "fixed_limit": 1000}}


# -- the synthetic client side -------------------------------------------------
def make_scope(port: int) -> dict[str, Any]:
    """A scope as uvicorn (httptools) builds it for ``GET /1k`` from a load generator."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8080),
        "client": ("127.0.0.1", 50000),
        "scheme": "http",
        "method": "GET",
        "root_path": "",
        "path": "/1k",
        "raw_path": b"/1k",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:8080"),
            (b"user-agent", b"loadgen/1.0"),
            (b"accept", b"*/*"),
            (b"x-deadline-ms", b"5000"),
        ],
        "state": {},
    }


_FOREVER: asyncio.Future[Any] | None = None
_REQUEST = {"type": "http.request", "body": b"", "more_body": False}


async def one_request(app: App, scope: dict[str, Any]) -> int:
    """One request through ``app``; returns the status sent."""
    sent_body = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return _REQUEST
        await asyncio.get_running_loop().create_future()  # like uvicorn: until disconnect
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(dict(scope), receive, send)
    return status


# -- fake transport ------------------------------------------------------------
class _OneChunk(httpx.AsyncByteStream):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield BODY_1K

    async def aclose(self) -> None:
        return None


class FakeTransport(httpx.AsyncBaseTransport):
    """200 + 1 KB at once, as a pooled upstream would (no I/O)."""

    _HEADERS = [
        (b"Server", b"nginx"),
        (b"Date", b"Mon, 30 Nov 2026 05:00:00 GMT"),
        (b"Content-Type", b"application/octet-stream"),
        (b"Content-Length", b"1024"),
        (b"Connection", b"keep-alive"),
        (b"ETag", b'"abc-400"'),
        (b"Accept-Ranges", b"bytes"),
    ]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=self._HEADERS, stream=_OneChunk(), request=request)


# -- configurations --------------------------------------------------------------
def stacks(transport: httpx.AsyncBaseTransport, upstream: str) -> dict[str, App]:
    """Each stage added in turn around one ProxyApp, plus the whole gateway."""
    config = build_config({"upstream": upstream, **FIXED})
    metrics = Metrics()
    parts = build_parts(config, metrics)
    proxy = ProxyApp(upstream, config=config.proxy, transport=transport, metrics=metrics)
    out: dict[str, App] = {"proxy": proxy, "admission": _with_ctx(proxy, parts, config)}
    app: App = breaker_and_retry(proxy, parts, config, retries=True)
    out["+breaker"] = _with_ctx(app, parts, config)
    app = ConcurrencyMiddleware(app, limiter=parts.limiter, responder=parts.responder,
                                metrics=metrics)  # fmt: skip
    out["+concurrency"] = _with_ctx(app, parts, config)
    app = QueueMiddleware(app, limiter=parts.limiter, queue=parts.queue,
                          responder=parts.responder, metrics=metrics)  # fmt: skip
    out["+queue"] = _with_ctx(app, parts, config)
    assert parts.capacity is not None
    app = CapacityMiddleware(app, capacity=parts.capacity, responder=parts.responder)
    out["+capacity"] = _with_ctx(app, parts, config)
    gateway = build_gateway(config, transport=transport, env={})
    out["gateway"] = gateway
    return out


def _with_ctx(app: App, parts: Any, config: Any) -> App:
    """Admission in front (the inner stages need its context)."""
    return AdmissionMiddleware(
        app, responder=parts.responder, metrics=parts.metrics,
        default_priority=config.priority.default, classifier=Classifier(config.priority),
    )  # fmt: skip


# -- measuring -------------------------------------------------------------------
async def run_batch(app: App, scope: dict[str, Any], n: int, conc: int) -> float:
    """CPU microseconds per request for ``n`` requests, ``conc`` at a time."""
    per_worker = n // conc

    async def worker() -> None:
        for _ in range(per_worker):
            status = await one_request(app, scope)
            if status != 200:
                raise RuntimeError(f"status {status}")

    t0 = time.process_time()
    if conc == 1:
        await worker()
    else:
        await asyncio.gather(*(worker() for _ in range(conc)))
    return (time.process_time() - t0) / (per_worker * conc) * 1e6


async def measure(apps: dict[str, App], port: int, n: int, reps: int, conc: int) -> None:
    """Warm up, then alternate configurations ``reps`` times; print medians."""
    if ONLY:
        apps = {name: app for name, app in apps.items() if name in ONLY}
    scope = make_scope(port)
    for app in apps.values():
        await run_batch(app, scope, min(n, 2000), conc)
    results: dict[str, list[float]] = {name: [] for name in apps}
    for rep in range(reps):
        names = list(apps)
        names = names[rep % len(names) :] + names[: rep % len(names)]
        for name in names:
            results[name].append(await run_batch(apps[name], scope, n, conc))
    base = statistics.median(results[next(iter(apps))])
    print(f"{'config':14s} {'median us/req':>13s} {'min':>7s} {'max':>7s} {'x first':>8s}")
    for name, values in results.items():
        med = statistics.median(values)
        print(
            f"{name:14s} {med:13.1f} {min(values):7.1f} {max(values):7.1f} {med / base:8.2f}",
            flush=True,
        )


# -- real upstream -----------------------------------------------------------------
@contextlib.contextmanager
def upstream_server() -> Iterator[int]:
    """nginx serving 1 KB on a free loopback port (stopped by PID on exit)."""
    if find_binary("nginx") is None:
        raise SystemExit("--mode real needs nginx (apt-get install nginx-light)")
    with tempfile.TemporaryDirectory() as tmp, processes(Path(tmp)) as procs:
        yield start_nginx_backend(procs, None).port


async def _real(n: int, reps: int, conc: int, port: int) -> None:
    from experiments.bench.bare import aiohttp_app

    upstream = f"http://127.0.0.1:{port}"
    bare = aiohttp_app(upstream)
    lifespan = asyncio.Queue[dict[str, Any]]()
    await lifespan.put({"type": "lifespan.startup"})
    started = asyncio.Event()

    async def ls_send(message: dict[str, Any]) -> None:
        started.set()

    task = asyncio.ensure_future(bare({"type": "lifespan"}, lifespan.get, ls_send))
    await started.wait()
    transport = AiohttpTransport()
    proxy = ProxyApp(upstream, transport=AiohttpTransport())
    config = build_config({"upstream": upstream, **FIXED})
    gateway = build_gateway(config, transport=transport, env={})
    try:
        await measure({"bare-aiohttp": bare, "proxy": proxy, "gateway": gateway}, port, n, reps,
                      conc)  # fmt: skip
    finally:
        await lifespan.put({"type": "lifespan.shutdown"})
        await task
        await transport.aclose()
        await proxy.aclose()


def main(argv: list[str] | None = None) -> None:
    """Parse options and run one mode."""
    p = argparse.ArgumentParser(prog="python -m experiments.hotpath")
    p.add_argument("--mode", choices=("fake", "real"), default="fake")
    p.add_argument("--n", type=int, default=20_000, help="requests per configuration and rep")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--conc", type=int, default=1, help="requests in flight (default 1)")
    p.add_argument("--no-uvloop", action="store_true")
    p.add_argument("--only", default="", help="comma-separated configurations to run")
    a = p.parse_args(argv)
    ONLY.update(x for x in a.only.split(",") if x)
    if not a.no_uvloop:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if a.mode == "fake":
        upstream = "http://127.0.0.1:9"
        asyncio.run(measure(stacks(FakeTransport(), upstream), 9, a.n, a.reps, a.conc))
    else:
        with upstream_server() as port:
            asyncio.run(_real(a.n, a.reps, a.conc, port))


if __name__ == "__main__":
    main()
