"""The gateway's own Python per proxied request, in process: no sockets, no kernel, no peers.

    python -m experiments.bench.inproc [--requests 20000] [--reps 5] [--config F.yaml ...]

The headroom table (``headroom.py``) measures what a core spends per request
with wrk, nginx and the kernel around the gateway; on a shared two-core
machine that number moves with the other sessions' load, and part of it
(about a third here, by ``perf``) is the kernel's: the socket calls and the
wake-ups of the peers. This bench measures the rest, which is the part our
code decides: the gateway's server protocol (the one ``uvicorn
ballast_asgi.gateway:app`` installs) is fed a request's bytes by hand, the
upstream request it writes is answered by hand on a pooled lean connection
with nginx's own 1 KB response, and the loop is turned until the response
bytes are written back. Everything of the gateway runs (the wire decision,
the stages, the lane or the ASGI task, the lean client, the metrics); only
the transports are fakes that keep what is written. It prints the median of
``--reps`` runs, in microseconds of CPU time (the process's) per request, for
the gateway with its defaults and with each ``--config`` (e.g. ``server:
{lane: false}`` for the ASGI path), interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: wrk's request (what the headroom table sends).
REQUEST = b"GET /1k HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
#: nginx's answer to it (the 1 KB backend of the headroom table), head and body in one read.
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Thu, 03 Dec 2026 17:13:00 GMT\r\n"
    b"Content-Type: application/octet-stream\r\nContent-Length: 1024\r\n"
    b"Last-Modified: Thu, 03 Dec 2026 17:13:00 GMT\r\nConnection: keep-alive\r\n"
    b'ETag: "6930f00c-400"\r\nAccept-Ranges: bytes\r\n\r\n' + b"x" * 1024
)


class RecordingTransport:
    """Keeps what is written (``out``); ``on_write`` sees each write (an upstream answers)."""

    def __init__(self, on_write: Callable[[bytes], None] | None = None) -> None:
        self.out: list[bytes] = []
        self.closed = False
        self.on_write = on_write

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5000)}.get(name, default)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        self.out.append(data)
        if self.on_write is not None:
            self.on_write(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        return None

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def get_write_buffer_size(self) -> int:
        return 0


async def _run(config_path: str | None, requests: int) -> float:
    """Microseconds of wall time per request for one gateway (see the module)."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    from ballast_asgi.config import load_config
    from ballast_asgi.gateway.root import build_gateway
    from ballast_asgi.proxy.transports.lean import LeanTransport
    from ballast_asgi.proxy.transports.lean_conn import Conn
    from ballast_asgi.server.guarded import guarded_protocol
    from ballast_asgi.server.wire import WireShedProtocol

    env = {"BALLAST_UPSTREAM": "http://127.0.0.1:9"}
    config = load_config(env=env, path=config_path)
    gw = build_gateway(config, env=env, config_path=config_path)
    gw.server_may_rewrite = False  # what adoption sets under ``uvicorn ...gateway:app``
    await gw.pieces.proxy_app.startup()
    lean = gw.pieces.proxy_app.connections.direct
    assert isinstance(lean, LeanTransport)
    pool = lean._pool
    up = RecordingTransport()
    conn = Conn(("127.0.0.1", 9), pool.release)
    conn.connection_made(up)  # type: ignore[arg-type]
    conn.idle_since = conn.loop.time()
    pool.idle[conn.key] = [conn]
    pool.idle_count = 1
    wire = config.server.shed_at_wire
    cls = guarded_protocol(config.server, WireShedProtocol if wire else None)
    uv = Config(app=gw, http=cls, lifespan="off", log_level="error", proxy_headers=False,
                access_log=False, server_header=False, date_header=False)  # fmt: skip
    uv.load()
    protocol = cls(config=uv, server_state=ServerState(), app_state={})
    client = RecordingTransport()
    protocol.connection_made(client)  # type: ignore[arg-type]
    yield_ = asyncio.sleep

    async def one() -> None:
        protocol.data_received(REQUEST)
        turns = 0
        while not up.out:
            await yield_(0)
            turns += 1
            if turns > 50:
                raise RuntimeError("the gateway sent nothing upstream")
        up.out.clear()
        conn.data_received(RESPONSE)
        turns = 0
        while not client.out or len(client.out[-1]) < 1024:
            await yield_(0)
            turns += 1
            if turns > 50:
                raise RuntimeError(f"no response: {client.out!r}")
        client.out.clear()

    for _ in range(200):  # warm-up
        await one()
    gc.collect()
    gc.freeze()  # what the gateway's lifespan does once started (``freeze_after_startup``)
    start = time.process_time()
    for _ in range(requests):
        await one()
    took = time.process_time() - start
    gc.unfreeze()
    return took / requests * 1e6


def measure(configs: list[str | None], requests: int, reps: int) -> dict[str, list[float]]:
    """Each config ``reps`` times, interleaved, each in a fresh loop (uvloop)."""
    import uvloop

    out: dict[str, list[float]] = {str(c or "defaults"): [] for c in configs}
    for _ in range(reps):
        for c in configs:
            out[str(c or "defaults")].append(uvloop.run(_run(c, requests)))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m experiments.bench.inproc")
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--config", action="append", default=[], help="a YAML config (repeatable)")
    a = p.parse_args(argv)
    for c in a.config:
        if not Path(c).is_file():
            raise SystemExit(f"--config: no file {c!r}")
    runs = measure([None, *a.config], a.requests, a.reps)
    print("| gateway | us per request (median) | range |")
    print("| --- | --- | --- |")
    for name, values in runs.items():
        print(f"| {name} | {statistics.median(values):.1f} | {min(values):.1f}-{max(values):.1f} |")


if __name__ == "__main__":
    main()
