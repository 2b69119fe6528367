"""What a shed at the wire costs in process, piece by piece (issue 31 item 1).

    python -m experiments.bench.wire_micro [--number 20000] [--repeat 25]

The gateway's ``WireShedProtocol`` (default config) is fed a dead-on-arrival
request (``X-Deadline-Ms: 0``) by hand on a fake transport, and each piece is
timed with ``timeit`` (the minimum of ``--repeat`` runs of ``--number`` calls,
microseconds per call): the whole shed, the protocol with the decision stubbed
(the answer returned as is), httptools alone, the decision
(``at_wire.decide``), the response (``ShedResponder.response``) and
``Gateway.shed_at_wire`` around both. Last, uvicorn's own floor (the headroom
table's constant-429 app under ``HttpToolsProtocol``) against the wire in the
same uvloop loop, each request run to its end. No sockets, so no system calls:
what the Python costs. Pin it (``taskset -c 1``); the machine's noise is in
the spread between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import timeit
from collections.abc import Callable
from typing import Any

import httptools
import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from ballast_asgi.config import load_config
from ballast_asgi.gateway import Gateway
from ballast_asgi.middleware import at_wire
from ballast_asgi.middleware.pipeline import Pipeline
from ballast_asgi.server.serve import uvicorn_settings
from experiments.bench.headroom import floor_app

DOA = b"GET / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nX-Deadline-Ms: 0\r\n\r\n"
HEADERS = [(b"host", b"127.0.0.1:8080"), (b"x-deadline-ms", b"0")]


class FakeTransport(asyncio.Transport):
    """Counts writes; never closes, never pauses."""

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes += 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        peers = {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50000)}
        return peers.get(name, default)

    def is_closing(self) -> bool:
        return False


class _Sink:
    """httptools callbacks that do nothing (the parser's own cost)."""

    def on_message_begin(self) -> None: ...
    def on_url(self, url: bytes) -> None: ...
    def on_header(self, name: bytes, value: bytes) -> None: ...
    def on_headers_complete(self) -> None: ...
    def on_message_complete(self) -> None: ...


def best(fn: Callable[[], object], number: int, repeat: int) -> float:
    """Microseconds per call: the minimum over ``repeat`` runs."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def wire_protocol(loop: asyncio.AbstractEventLoop) -> tuple[Any, Gateway, FakeTransport]:
    """The gateway form's protocol, connected to a fake transport."""
    config = load_config(env={"BALLAST_UPSTREAM": "http://127.0.0.1:9"})
    gateway = Gateway(config, env={})
    gateway.server_may_rewrite = False  # what uvicorn's adoption of the gateway sets
    settings = {**uvicorn_settings(config.server, config.websocket, gateway.server_protocol),
                "access_log": False, "date_header": False}  # fmt: skip
    cfg = uvicorn.Config(gateway, **settings, lifespan="off")
    cfg.load()
    proto = settings["http"](config=cfg, server_state=ServerState(), app_state={}, _loop=loop)
    transport = FakeTransport()
    proto.connection_made(transport)
    return proto, gateway, transport


def floor_protocol(loop: asyncio.AbstractEventLoop) -> tuple[Any, FakeTransport]:
    """uvicorn's own protocol serving the constant 429 (the headroom table's floor)."""
    cfg = uvicorn.Config(floor_app, access_log=False, server_header=False, date_header=False,
                         lifespan="off", http="httptools")  # fmt: skip
    cfg.load()
    proto = HttpToolsProtocol(config=cfg, server_state=ServerState(), app_state={}, _loop=loop)
    transport = FakeTransport()
    proto.connection_made(transport)
    return proto, transport


def pieces(number: int, repeat: int) -> list[str]:
    """The wire's pieces, timed one by one."""
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    proto, gateway, _ = wire_protocol(loop)
    stack = gateway._stack
    assert isinstance(stack, Pipeline)
    stages = stack.stages
    memo: list[object] = [None]
    answer = gateway.shed_at_wire("GET", "/", b"/", HEADERS, "127.0.0.1", "", memo)
    assert answer is not None, "the request was not shed at the wire"
    shed = answer[0]
    parser = httptools.HttpRequestParser(_Sink())
    out = [
        f"whole shed, data_received: {best(lambda: proto.data_received(DOA), number, repeat):.2f}"
    ]
    proto._at_wire = lambda *_: answer
    out.append(
        f"protocol, decision stubbed: {best(lambda: proto.data_received(DOA), number, repeat):.2f}"
    )
    out.append(
        f"httptools feed_data alone: {best(lambda: parser.feed_data(DOA), number, repeat):.2f}"
    )
    decide = lambda: at_wire.decide(stages, "GET", "/", b"/", HEADERS, "127.0.0.1", memo)  # noqa: E731
    out.append(f"at_wire.decide (counted): {best(decide, number, repeat):.2f}")
    respond = lambda: gateway.parts.responder.response(shed)  # noqa: E731
    out.append(f"ShedResponder.response: {best(respond, number, repeat):.2f}")
    whole = lambda: gateway.shed_at_wire("GET", "/", b"/", HEADERS, "127.0.0.1", "", memo)  # noqa: E731
    out.append(f"Gateway.shed_at_wire: {best(whole, number, repeat):.2f}")
    loop.close()
    return out


def against_floor(number: int, repeat: int) -> list[str]:
    """uvicorn's floor and the wire's shed, each request run to its end in one uvloop loop."""
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    floor, _ = floor_protocol(loop)
    wire, _, _ = wire_protocol(loop)

    async def run(proto: Any, feed: bool) -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            if feed:
                proto.data_received(DOA)
            await asyncio.sleep(0)  # the floor's task: started, then finished
            await asyncio.sleep(0)
        return time.perf_counter() - t0

    async def go() -> list[str]:
        idle = min([await run(floor, False) for _ in range(repeat)])
        fl = min([await run(floor, True) for _ in range(repeat)])
        ws = min([await run(wire, True) for _ in range(repeat)])
        return [f"same loop: uvicorn floor {(fl - idle) / number * 1e6:.2f}, "
                f"wire shed {(ws - idle) / number * 1e6:.2f}"]  # fmt: skip

    try:
        return loop.run_until_complete(go())
    finally:
        loop.close()


def main(argv: list[str] | None = None) -> int:
    """Print the pieces and the same-loop comparison (us per request)."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench.wire_micro", description=__doc__)
    p.add_argument("--number", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=25)
    a = p.parse_args(argv)
    for line in pieces(a.number, a.repeat) + against_floor(a.number // 4, max(3, a.repeat // 4)):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
