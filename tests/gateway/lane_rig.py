"""An in-process gateway behind its own server protocol, for the lane's tests (ADR 0020).

``LaneRig`` is ``uvicorn ballast_asgi.gateway:app`` without sockets: the
gateway (``build_gateway``, a ``FakeClock``, seeded randomness, a private
registry) behind the server protocol the gateway form installs
(``WireShedProtocol`` with the config's limits), a client connection whose
transport keeps what is written, and the lean transport's pool whose
connections (``Conn``) have fake transports too: what the gateway writes
upstream is answered by ``upstream(request_bytes, earlier)`` (the requests this
rig's upstream saw before), as a list of reads (``bytes``), with ``CLOSE`` for an
EOF, each read delivered on its own loop turn. New connections are made the
same way (nothing listens anywhere). ``lane`` switches ``server.lane``: the
same script through both arms must give the same bytes, upstream traffic and
counters, and ``tasks`` counts the ASGI tasks started (a request the lane
served to its end starts none: so a test knows the lane ran).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from uvicorn.config import Config
from uvicorn.server import ServerState

from ballast_asgi.config import build_config
from ballast_asgi.gateway.root import build_gateway
from ballast_asgi.proxy.transports.lean import LeanTransport
from ballast_asgi.proxy.transports.lean_conn import Conn
from ballast_asgi.server.guarded import guarded_protocol
from ballast_asgi.server.wire import WireShedProtocol
from experiments.bench.inproc import RecordingTransport
from tests.fakes import FakeClock

#: An upstream read that is an EOF (the upstream closed the connection).
CLOSE = b"<close>"
Upstream = Callable[[bytes, list[bytes]], list[bytes]]
#: Metrics whose value is the real loop's or the process's, not the stages'.
_VOLATILE = (
    *("_created", "ballast_event_loop", "process_", "python_"),
    "ballast_breaker_state_seconds",
)


class LaneRig:
    """One gateway, one client connection, a scripted upstream (see the module)."""

    def __init__(self, upstream: Upstream, *, lane: bool, config: dict[str, Any] | None = None):
        config = config or {}
        cfg = build_config(
            {"upstream": "http://127.0.0.1:9", **config,
             "retry": {"backoff_base_ms": 0, **config.get("retry", {})},  # no real-time wait
             "server": {"lane": lane, **config.get("server", {})}}
        )  # fmt: skip
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        self.gw = build_gateway(cfg, clock=self.clock, rng=random.Random(7), registry=self.registry)
        self.gw.server_may_rewrite = False  # what adoption sets under uvicorn
        self.cfg = cfg
        self.upstream = upstream
        self.seen: list[bytes] = []  # every upstream request, in order
        self.conns: list[Conn] = []
        #: ASGI tasks started for requests (a request the lane served to its end starts none).
        self.tasks = 0
        self.protocol: Any = None
        self.client = RecordingTransport()

    async def start(self, idle: int = 2) -> None:
        """Open the proxy's client, ``idle`` pooled upstream connections, the client side."""
        proxy = self.gw.pieces.proxy_app
        await proxy.startup()
        lean = proxy.connections.direct
        assert isinstance(lean, LeanTransport)
        pool = lean._pool
        self.pool = pool

        async def connect(key: tuple[str, int], limits: Any, deadline: Any) -> Conn:
            return self._conn(key)

        pool.connector = connect
        for _ in range(idle):
            conn = self._conn(("127.0.0.1", 9))
            pool.in_use += 1
            pool.release(conn, True)
        self.connect()

    def connect(self) -> None:
        """A new client connection (the next ``send`` goes on it)."""
        cls = guarded_protocol(self.cfg.server, WireShedProtocol)
        uv = Config(app=self.gw, http=cls, lifespan="off", log_level="error", proxy_headers=False,
                    access_log=False, server_header=False, date_header=False)  # fmt: skip
        uv.load()
        self.client = RecordingTransport()
        self.protocol = cls(config=uv, server_state=ServerState(), app_state={})
        self.protocol.connection_made(self.client)
        start = self.protocol._start_asgi_task

        def counted(cycle: Any, app: Any) -> None:
            self.tasks += 1
            start(cycle, app)

        self.protocol._start_asgi_task = counted

    def _conn(self, key: tuple[str, int]) -> Conn:
        conn = Conn(key, self.pool.release)
        loop = asyncio.get_running_loop()

        def answer(data: bytes) -> None:
            self.seen.append(data)
            reads = self.upstream(data, self.seen[:-1])
            if reads:  # the answer takes 10 ms of the gateway's clock: RTTs are not zero
                loop.call_soon(self.clock.advance, 0.01)
            for delay, read in enumerate(reads, 1):
                loop.call_soon(_later, delay, self._deliver, conn, read)

        conn.connection_made(RecordingTransport(answer))  # type: ignore[arg-type]
        self.conns.append(conn)
        return conn

    @staticmethod
    def _deliver(conn: Conn, read: bytes) -> None:
        if conn.closed:
            return
        if read == CLOSE:
            conn.eof_received()
            conn.connection_lost(None)
        else:
            conn.data_received(read)

    async def send(self, raw: bytes, turns: int = 2_000) -> bytes:
        """Feed ``raw`` to the client connection, turn the loop until every response to it
        is complete (or the connection closed), then a few more; the bytes written back."""
        before = len(self.client.out)
        protocol = self.protocol
        protocol.data_received(raw)
        for _ in range(turns):
            await asyncio.sleep(0)
            cycle = protocol.cycle
            if self.client.closed or (
                (cycle is None or cycle.response_complete) and not protocol.pipeline
            ):
                break
        else:
            raise AssertionError(f"no complete response to {raw!r} in {turns} loop turns")
        for _ in range(20):  # what a response's end still schedules (flushes, releases)
            await asyncio.sleep(0)
        return b"".join(self.client.out[before:])

    def metrics(self) -> list[str]:
        """The exposition's lines that the stages decide (no loop- or process-time values)."""
        text = generate_latest(self.registry).decode()
        return [
            line for line in text.splitlines()
            if line and not line.startswith("#") and not any(v in line for v in _VOLATILE)
        ]  # fmt: skip


def _later(delay: int, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(*args)`` ``delay`` loop turns from now (each read on a turn of its own)."""
    if delay <= 1:
        fn(*args)
    else:
        asyncio.get_running_loop().call_soon(_later, delay - 1, fn, *args)


__all__ = ["CLOSE", "LaneRig"]
