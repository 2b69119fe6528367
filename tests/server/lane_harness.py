"""A differential harness for the proxied lane (ADR 0020): one script, two gateways.

``lane_pair`` serves the same config twice on real uvicorn servers (the gateway
form, as ``uvicorn ballast_asgi.gateway:app`` and the ``ballast`` CLI serve it:
``uvicorn_settings`` with the gateway's own server protocol), once with
``server.lane: true`` and once with ``server.lane: false``, in front of one
``RawUpstream``: an asyncio server in its own thread that answers each path
with programmed raw bytes and records every request head it received, on which
upstream connection. ``Arm.play`` warms the gateway's upstream pool (the lane
needs an idle pooled connection), then runs a client script on raw sockets and
returns an ``Observation``: every byte the client read (``date`` lines dropped),
how each connection ended, the heads the upstream received (``x-deadline-ms``
values kept apart, compared within a tolerance) and the deltas of the gateway's
counters (histograms by their ``_count`` only) and of its stages' counts.

Longer than 300 lines on purpose: the raw upstream, the raw client, the arms and
the comparison are one instrument; each is small and only the test module uses them.
"""

from __future__ import annotations

import asyncio
import gc
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from ballast_asgi.config import load_config
from ballast_asgi.gateway import Gateway
from ballast_asgi.server.serve import uvicorn_settings
from tests.e2e.servers import serving
from tests.e2e.support import HANG_S, free_port
from tests.fakes import CountingGateway

#: Every socket read in the harness gives up after this long (a bound, never a pause).
READ_TIMEOUT_S = 5.0
#: ``x-deadline-ms`` values the two arms send upstream may differ by this much (time passes).
DEADLINE_TOLERANCE_MS = 60
PROBE = b"GET /probe HTTP/1.1\r\nHost: t\r\n\r\n"
WARM = b"GET /warm HTTP/1.1\r\nHost: t\r\n\r\n"


def ok(body: bytes = b"ok", status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    """A complete content-length framed response."""
    return b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\n%sContent-Length: %d\r\n\r\n%s" % (
        status,
        extra,
        len(body),
        body,
    )


@dataclass(frozen=True)
class Close:
    """Write these bytes, then close the upstream connection."""

    data: bytes


@dataclass(frozen=True)
class Hold:
    """Write these bytes (maybe none), then hold the connection until the gateway closes it."""

    data: bytes = b""


@dataclass(frozen=True)
class Gated:
    """Write these bytes once the test calls ``RawUpstream.release(name)``."""

    name: str
    data: bytes


@dataclass(frozen=True)
class Pieces:
    """Write these pieces one by one, each flushed and followed by a short pause: it shapes
    how the gateway's reads split the response (the assertions hold for any split)."""

    parts: tuple[bytes, ...]


Reply = bytes | Close | Hold | Gated | Pieces


@dataclass
class Request:
    """One request (head and body) the upstream read, and the connection it came on."""

    conn: int
    head: bytes


class RawUpstream:
    """An HTTP/1.1 upstream of raw bytes, programmable per path, recording what it read."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.received: list[Request] = []
        self.closed_by_gateway: list[int] = []
        #: Set whenever a request head arrives or a gateway closes a connection.
        self.changed = threading.Event()
        self._programs: dict[str, list[Reply]] = {}
        self._served: dict[str, int] = {}
        self._conns = 0
        self._first_conn = 0
        self._server: asyncio.base_events.Server | None = None
        self._gates: dict[str, asyncio.Event] = {}
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> None:
        """Listen on a free loopback port (returns once listening)."""
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self.loop)
        future.result(READ_TIMEOUT_S)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        """Close the listener and every connection, stop the loop and its thread."""

        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            await asyncio.wait(handlers, timeout=READ_TIMEOUT_S) if handlers else None

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(READ_TIMEOUT_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(READ_TIMEOUT_S)
        self.loop.close()

    def program(self, path: str, *replies: Reply) -> None:
        """Answer ``path`` with ``replies`` in turn (the last one repeats)."""
        self._programs[path] = list(replies)

    def release(self, name: str) -> None:
        """Let the ``Gated`` replies named ``name`` be written (now and from now on)."""
        self.loop.call_soon_threadsafe(self._gate(name).set)

    def _gate(self, name: str) -> asyncio.Event:
        return self._gates.setdefault(name, asyncio.Event())

    def reset(self) -> None:
        """Forget what was received and restart every program; earlier connections are old."""
        self.received = []
        self.closed_by_gateway = []
        self._served = {}
        self._first_conn = self._conns
        for gate in self._gates.values():
            self.loop.call_soon_threadsafe(gate.clear)

    def conn_name(self, conn: int) -> str:
        """``pooled`` for a connection opened before the last reset, else ``new``."""
        return "pooled" if conn < self._first_conn else "new"

    def _reply(self, path: str) -> Reply:
        replies = self._programs.get(path, [ok()])
        n = self._served.get(path, 0)
        self._served[path] = n + 1
        return replies[min(n, len(replies) - 1)]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self._conns
        self._conns += 1
        self._writers.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_by_gateway.append(conn)
                    return
                length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if length:
                    head += await reader.readexactly(int(length.group(1)))
                self.received.append(Request(conn, head))
                self.changed.set()
                path = head.split(b" ", 2)[1].split(b"?")[0].decode()
                reply = self._reply(path)
                if isinstance(reply, Gated):
                    await self._gate(reply.name).wait()
                if isinstance(reply, Pieces):
                    for part in reply.parts:
                        writer.write(part)
                        await writer.drain()
                        await asyncio.sleep(0.005)  # shapes the input; asserts nothing
                    continue
                writer.write(reply if isinstance(reply, bytes) else reply.data)
                await writer.drain()
                if isinstance(reply, Close):
                    return
                if isinstance(reply, Hold):
                    await reader.read()  # EOF: the gateway gave the exchange up
                    self.closed_by_gateway.append(conn)
                    return
        except ConnectionError:
            self.closed_by_gateway.append(conn)
        finally:
            self._writers.discard(writer)
            self.changed.set()
            writer.close()


class Client:
    """A raw client connection; everything it reads goes to ``transcript``."""

    def __init__(self, port: int, source: str = "127.0.0.1") -> None:
        self.sock = socket.create_connection(
            ("127.0.0.1", port), timeout=READ_TIMEOUT_S, source_address=(source, 0)
        )
        self.transcript: list[bytes] = []
        self._buf = b""
        self._eof = False

    def send(self, data: bytes) -> None:
        """Write ``data`` (a whole script step) at once."""
        self.sock.sendall(data)

    def _fill(self) -> bool:
        if self._eof:
            return False
        try:
            chunk = self.sock.recv(1 << 20)
        except TimeoutError:
            self.transcript.append(b"<timeout>")
            self._eof = True
            return False
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def _take(self, n: int) -> bytes:
        while len(self._buf) < n and self._fill():
            pass
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _line(self) -> bytes | None:
        while b"\r\n" not in self._buf:
            if not self._fill():
                return None
        line, self._buf = self._buf.split(b"\r\n", 1)
        return line + b"\r\n"

    def response(self, *, head: bool = False) -> bytes:
        """Read one response by its framing (``head``: the request was HEAD), interim (1xx)
        heads before it included; the bytes read, ending in ``<eof>`` when the connection
        closed before the response was complete."""
        interim = b""
        while True:
            answer = self._one(head)
            if not re.match(rb"HTTP/1\.\d 1\d\d ", answer) or answer.startswith(b"HTTP/1.1 101"):
                break
            interim += answer
        return self._record(interim + answer)

    def _one(self, head: bool) -> bytes:
        while b"\r\n\r\n" not in self._buf:
            if not self._fill():
                return self._take(len(self._buf)) + b"<eof>"
        end = self._buf.index(b"\r\n\r\n") + 4
        top, self._buf = self._buf[:end], self._buf[end:]
        status = int(top.split(b" ", 2)[1])
        fields = dict(
            (k.strip().lower(), v.strip())
            for k, _, v in (line.partition(b":") for line in top.split(b"\r\n")[1:-2])
        )
        top = re.sub(rb"(?im)^date:[^\r]*\r\n", b"", top)
        if head or status in (204, 304) or status < 200:
            return top
        if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            return top + self._chunks()
        if b"content-length" in fields:
            length = int(fields[b"content-length"])
            body = self._take(length)
            return top + body + (b"<eof>" if len(body) < length else b"")
        return top + self.until_close()

    def _chunks(self) -> bytes:
        out = b""
        while True:
            line = self._line()
            if line is None:
                return out + self._take(len(self._buf)) + b"<eof>"
            out += line
            size = int(line.split(b";")[0], 16)
            if size == 0:
                while (line := self._line()) not in (b"\r\n", None):
                    out += line
                return out + (line or b"<eof>")
            data = self._take(size + 2)
            out += data
            if len(data) < size + 2:
                return out + b"<eof>"

    def until_close(self) -> bytes:
        """Everything until the server closes (``<timeout>`` recorded if it does not)."""
        while self._fill():
            pass
        out, self._buf = self._buf, b""
        return out

    def ending(self) -> str:
        """How the connection ends after the script: ``open`` (a probe request is answered, its
        response recorded) or ``closed`` (the server closed; what came first is recorded)."""
        if self._buf:
            self._record(b"<unread>" + self._buf)
            self._buf = b""
        try:
            self.sock.sendall(PROBE)
        except (BrokenPipeError, ConnectionResetError):
            return "closed"
        answer = self.response()
        return "closed" if answer.endswith(b"<eof>") else "open"

    def _record(self, data: bytes) -> bytes:
        self.transcript.append(data)
        return data

    def close(self) -> None:
        """Close the client side."""
        self.sock.close()


@dataclass
class Observation:
    """What one arm did with one script."""

    responses: list[list[bytes]]
    endings: list[str]
    upstream: list[tuple[str, bytes]]
    deadlines: list[int]
    metrics: dict[str, float]
    notes: list[str]
    #: The gateway's requests all ended (nothing held, no permit in flight) within the bound.
    settled: bool
    extra: dict[str, Any] = field(default_factory=dict)


Script = Callable[["Arm"], list[Client]]


@dataclass
class Arm:
    """One served gateway (lane on or off) in front of the shared upstream."""

    lane: bool
    port: int
    gateway: CountingGateway
    upstream: RawUpstream
    #: What a script observed besides its clients' bytes (compared between the arms too).
    notes: list[str] = field(default_factory=list)

    def client(self, source: str = "127.0.0.1") -> Client:
        """A new raw connection to this gateway (from ``source``, a loopback address)."""
        return Client(self.port, source)

    def play(self, script: Script, *, warm: bool = True) -> Observation:
        """Warm the pool, run ``script`` (it returns its clients, ending them is ours) and
        observe: responses, endings, upstream heads and counter deltas."""
        self.upstream.reset()
        self.notes = []
        if warm:
            self._warm()
        before = counters(self.gateway)
        self.upstream.reset()
        calls = self.gateway.calls
        clients = script(self)
        endings = [c.ending() for c in clients]
        for c in clients:
            c.close()
        settled = self.settle()
        heads, deadlines = normalised(self.upstream)
        moved = delta(before, counters(self.gateway))
        extra = {"asgi_calls": self.gateway.calls - calls}
        transcripts = [c.transcript for c in clients]
        return Observation(
            transcripts, endings, heads, deadlines, moved, self.notes, settled, extra
        )

    def _warm(self) -> None:
        """One GET answered, so the gateway holds an idle pooled upstream connection."""
        c = self.client()
        c.send(WARM)
        answer = c.response()
        c.close()
        assert answer.startswith(b"HTTP/1.1 200"), answer
        assert self.settle(), "the warm-up request never finished"

    def settle(self) -> bool:
        """Wait (bounded) until no request is held or in flight in the gateway; whether so."""
        parts = self.gateway.parts
        assert parts.capacity is not None
        limit = time.monotonic() + HANG_S  # a hang guard: no event says "permit released"
        while parts.capacity.held or parts.limiter.inflight:  # bounded readiness poll
            if time.monotonic() > limit:
                return False
            time.sleep(0.002)
        return True

    def wait_upstream(self, predicate: Callable[[RawUpstream], bool]) -> bool:
        """Wait (bounded) until ``predicate(upstream)`` holds; whether it did."""
        limit = time.monotonic() + READ_TIMEOUT_S
        while not predicate(self.upstream):
            left = limit - time.monotonic()
            if left <= 0:
                return False
            self.upstream.changed.wait(left)
            self.upstream.changed.clear()
        return True


def normalised(upstream: RawUpstream) -> tuple[list[tuple[str, bytes]], list[int]]:
    """The received heads (connection as pooled/new, ``x-deadline-ms`` values taken out)."""
    heads = []
    deadlines = []
    for r in upstream.received:
        for m in re.finditer(rb"(?im)^x-deadline-ms:\s*(\d+)", r.head):
            deadlines.append(int(m.group(1)))
        head = re.sub(rb"(?im)^(x-deadline-ms:)[^\r]*", rb"\1 <n>", r.head)
        heads.append((upstream.conn_name(r.conn), head))
    return heads, deadlines


def counters(gateway: Gateway) -> dict[str, float]:
    """The gateway's counters and histogram counts, plus its stages' own counts."""
    out: dict[str, float] = {}
    for family in gateway.metrics.registry.collect():
        if family.type not in ("counter", "histogram"):
            continue
        for s in family.samples:
            kept = not s.name.endswith("_created")
            if not kept or (family.type == "histogram" and not s.name.endswith("_count")):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    parts = gateway.parts
    assert parts.capacity is not None
    out["capacity.refused"] = parts.capacity.refused
    out["limiter.rejected"] = parts.limiter.rejected
    out["limiter.acquired"] = parts.limiter.acquired
    for route, n in parts.route_table().counts.items():
        out[f"route[{route}]"] = n
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The values that changed, by how much."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def differences(off: Observation, on: Observation) -> list[str]:
    """Every way the lane arm's observation differs from the ASGI arm's, spelled out."""
    found = []
    for name in ("responses", "endings", "upstream", "metrics", "notes", "settled"):
        a, b = getattr(off, name), getattr(on, name)
        if a != b:
            found.append(f"{name}: lane off {a!r}\n    lane on  {b!r}")
    if len(off.deadlines) != len(on.deadlines) or any(
        abs(x - y) > DEADLINE_TOLERANCE_MS
        for x, y in zip(off.deadlines, on.deadlines, strict=False)
    ):
        found.append(f"x-deadline-ms: lane off {off.deadlines} lane on {on.deadlines}")
    return found


@dataclass
class Pair:
    """The two arms (lane off first: the reference) and their upstream."""

    off: Arm
    on: Arm
    upstream: RawUpstream

    def same(self, script: Script, *, warm: bool = True) -> Observation:
        """Play ``script`` on both arms; assert every observation equal; the reference's."""
        off = self.off.play(script, warm=warm)
        on = self.on.play(script, warm=warm)
        found = differences(off, on)
        assert not found, "the lane differs from the ASGI path:\n  " + "\n  ".join(found)
        assert off.settled, f"the ASGI path never finished its requests: {off!r}"
        off.extra["lane_asgi_calls"] = on.extra["asgi_calls"]
        if os.environ.get("LANE_DUMP"):  # LANE_DUMP=1 pytest -s: what both arms did
            print(f"\n{off!r}")
        return off


@contextmanager
def lane_pair(*, upstream_url: str | None = None, **overrides: Any) -> Iterator[Pair]:
    """One config served with ``server.lane`` false and true before one ``RawUpstream``
    (``upstream_url``: the gateways' upstream instead, e.g. a port that refuses)."""
    upstream = RawUpstream()
    upstream.start()
    with ExitStack() as stack:
        stack.callback(upstream.stop)
        stack.callback(gc.collect)  # a leaked transport is reported by this test, not a later one
        url = upstream_url or f"http://127.0.0.1:{upstream.port}"
        arms = []
        for lane in (False, True):
            layered = {"shed": {"retry_after_jitter": 0.0}, **overrides}
            # A request that never ends is closed 2 s into shutdown (``serving`` waits 10 s).
            server = {"shutdown_timeout_ms": 2_000, **overrides.get("server", {}), "lane": lane}
            layered["server"] = server
            config = load_config(env={"BALLAST_UPSTREAM": url}, overrides=layered)
            gateway = CountingGateway(config, env={})
            gateway.server_may_rewrite = False
            settings = {
                **uvicorn_settings(config.server, config.websocket, gateway.server_protocol),
                "access_log": False,
            }
            port = stack.enter_context(serving(gateway, **settings))
            arms.append(Arm(lane, port, gateway, upstream))
        yield Pair(arms[0], arms[1], upstream)


def refused_url() -> str:
    """An upstream URL on a loopback port nobody listens on."""
    return f"http://127.0.0.1:{free_port()}"
