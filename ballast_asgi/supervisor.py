"""Run ``ballast --workers N``: fork the workers, serve the aggregated admin port.

See ``ballast_asgi.workers`` for what is divided and what is merged.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import httpx
import uvicorn

from ballast_asgi.admin import empty_lifespan
from ballast_asgi.core.types import Receive, Scope, Send
from ballast_asgi.middleware.responses import send_json
from ballast_asgi.serve import QuietServer
from ballast_asgi.workers import merge_metrics

__all__ = ["Aggregator", "run_workers"]

#: Runs one worker's servers on (traffic socket, admin Unix socket) until it is told to stop.
WorkerFn = Callable[[int, socket.socket, socket.socket], None]


class Aggregator:
    """The admin-port app of the parent: metrics, snapshot and health over every worker."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await empty_lifespan(receive, send)
            return
        path = scope["path"].rstrip("/") or "/"
        if scope["type"] != "http" or path not in ("/metrics", "/snapshot", "/health"):
            await send_json(send, 404, {"error": "not_found"})
            return
        auth = [(k, v) for k, v in scope["headers"] if k == b"authorization"]
        answers = await asyncio.gather(*(self._ask(p, path, auth) for p in self.paths))
        refused = next((a for a in answers if a[0] != 200), None)
        if path == "/metrics" and refused is None:
            await _send_text(send, merge_metrics(a[1] for a in answers))
        elif path == "/snapshot" and refused is None:
            await send_json(send, 200, {"workers": [json.loads(a[1]) for a in answers]})
        elif path == "/health":
            bad = refused or answers[0]
            await send_json(send, bad[0], json.loads(bad[1]) if bad[1] else {"status": "down"})
        else:
            assert refused is not None
            await send_json(send, refused[0], {"error": "worker_refused"})

    async def _ask(self, uds: str, path: str, auth: list[tuple[bytes, bytes]]) -> tuple[int, str]:
        transport = httpx.AsyncHTTPTransport(uds=uds)
        try:
            async with httpx.AsyncClient(transport=transport, timeout=5.0) as client:
                r = await client.get(f"http://worker{path}", headers=auth)
                return r.status_code, r.text
        except httpx.TransportError:
            return 503, ""


async def _send_text(send: Send, text: str) -> None:
    body = text.encode()
    headers = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
               (b"content-length", str(len(body)).encode())]  # fmt: skip
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


#: ``prctl(2)`` option: the signal this process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """Have the kernel SIGTERM this worker when the supervisor dies, even by SIGKILL.

    A worker runs in its own process group, so a signal to the supervisor's
    group does not reach it; without this, a supervisor killed by the OOM
    killer or ``kill -9`` would leave its workers serving on, unsupervised.
    SIGTERM lets the worker drain as on a normal stop. Linux only; elsewhere
    a no-op. A parent that already died before the call ends the worker too.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)


def _fork(workers: int, traffic: socket.socket, run: WorkerFn, paths: list[str]) -> list[int]:
    pids, parent = [], os.getpid()
    for index in range(workers):
        admin = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        admin.bind(paths[index])
        admin.listen(64)
        pid = os.fork()
        if pid == 0:  # the worker, in its own process group: signals come from the parent only
            os.setpgid(0, 0)
            _die_with_parent(parent)
            code = 0
            try:
                run(index, traffic, admin)
            except BaseException:  # a worker must never return into the parent's code
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        admin.close()
        pids.append(pid)
    return pids


def run_workers(
    workers: int,
    traffic: socket.socket,
    admin: socket.socket | None,
    run: WorkerFn,
    settings: dict[str, Any],
) -> int:
    """Fork ``workers`` processes serving ``traffic``; serve ``admin`` until they all exit."""
    tmp = tempfile.mkdtemp(prefix="ballast-workers-")
    paths = [os.path.join(tmp, f"worker-{i}.sock") for i in range(workers)]
    try:
        pids = _fork(workers, traffic, run, paths)
        traffic.close()
        print(f"ballast: {workers} workers, PIDs {', '.join(map(str, pids))}", file=sys.stderr,
              flush=True)  # fmt: skip
        codes = asyncio.run(_parent(Aggregator(paths), admin, pids, settings))
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)
        os.rmdir(tmp)
    return max(codes, default=0)


async def _parent(
    app: Aggregator, admin: socket.socket | None, pids: list[int], settings: dict[str, Any]
) -> list[int]:
    """Forward signals to the workers; serve the aggregated admin port until they exit."""
    loop = asyncio.get_running_loop()

    def forward(sig: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, forward, sig)
    server = QuietServer(uvicorn.Config(app, lifespan="on", **settings)) if admin else None

    async def reap() -> list[int]:
        codes = [os.waitstatus_to_exitcode((await loop.run_in_executor(None, os.waitpid, p, 0))[1])
                 for p in pids]  # fmt: skip
        if server is not None:
            server.should_exit = True
        return codes

    reaper = asyncio.ensure_future(reap())
    if server is not None and admin is not None:
        await server.serve(sockets=[admin])
    return await reaper
