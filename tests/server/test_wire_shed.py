"""Shed at the wire (issue 31): the ASGI shed's bytes and counts, decided from the parsed head.

Every test serves one config twice on real uvicorn servers (``serving``): once with
``server.shed_at_wire: false`` (every request through uvicorn's ASGI cycle and the
stages, the reference) and once with the wire protocol, sends both the same raw
bytes and compares the bytes that come back and the gateway's metric deltas.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from ballast_asgi.config import load_config
from ballast_asgi.core.breaker import BreakerState
from ballast_asgi.core.outcome import Outcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.queue import Waiter
from ballast_asgi.core.types import Receive, Scope, Send
from ballast_asgi.gateway import Gateway
from ballast_asgi.server.serve import uvicorn_settings
from ballast_asgi.server.wire import WireShedProtocol
from tests.e2e.servers import servers, serving
from tests.fakes import CountingGateway

pytestmark = pytest.mark.e2e

DOA = b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\n\r\n"
PLAIN = b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n"


async def upstream(scope: Scope, receive: Receive, send: Send) -> None:
    """A constant 200 (the upstream of the requests that are not shed)."""
    if scope["type"] != "http":
        return
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


@dataclass
class Side:
    """One served gateway: its port and object."""

    port: int
    gateway: CountingGateway

    def exchange(self, data: bytes, responses: int, *, head: bool = False) -> bytes:
        """Send ``data`` on a new connection; the bytes of ``responses`` responses."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as sock:
            sock.sendall(data)
            return read_responses(sock, responses, head=head)

    def samples(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The gateway's counters and gauges (histograms, times and process state left out)."""
        out = {}
        for family in self.gateway.metrics.registry.collect():
            skip = family.type in ("histogram", "summary") or "seconds" in family.name
            if skip or family.name.startswith("process"):
                continue
            for s in family.samples:
                if not s.name.endswith("_created"):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


def read_responses(sock: socket.socket, count: int, *, head: bool = False) -> bytes:
    """Read ``count`` complete responses (content-length framed) and return their bytes."""
    data = b""
    pos = 0
    for _ in range(count):
        while b"\r\n\r\n" not in data[pos:]:
            chunk = sock.recv(65536)
            assert chunk, f"closed after {data!r}"
            data += chunk
        end = data.index(b"\r\n\r\n", pos) + 4
        length = 0
        for line in data[pos:end].split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        pos = end + (0 if head else length)
        while len(data) < pos:
            chunk = sock.recv(65536)
            assert chunk, f"closed in a body after {data!r}"
            data += chunk
    assert len(data) == pos, f"more than {count} responses: {data[pos:]!r}"
    return data


def read_to_close(sock: socket.socket) -> bytes:
    """Everything until the server closes its side."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@contextmanager
def pair(**overrides: Any) -> Iterator[tuple[Side, Side]]:
    """The same config served twice: the ASGI path (reference) and the wire (the three
    servers stopped together)."""
    with servers() as group:
        up = group.start(upstream, lifespan="off")
        sides = []
        for wire in (False, True):
            layered = {"shed": {"retry_after_jitter": 0.0}, **overrides}
            layered["server"] = {**overrides.get("server", {}), "shed_at_wire": wire}
            config = load_config(
                env={"BALLAST_UPSTREAM": f"http://127.0.0.1:{up}"}, overrides=layered
            )
            gateway = CountingGateway(config, env={})
            gateway.server_may_rewrite = False
            base = gateway.server_protocol
            settings = {
                **uvicorn_settings(config.server, config.websocket, base),
                "access_log": False,
            }
            sides.append(Side(group.start(gateway, **settings), gateway))
        yield sides[0], sides[1]


def delta(before: dict[Any, float], after: dict[Any, float]) -> dict[Any, float]:
    """The samples that changed."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def same(ref: Side, wire: Side, data: bytes, responses: int, **kw: Any) -> bytes:
    """Both sides answer ``data`` with the same bytes and the same metric and state deltas."""
    befores = [(s.samples(), _state(s.gateway)) for s in (ref, wire)]
    answers = [s.exchange(data, responses, **kw) for s in (ref, wire)]
    assert answers[0] == answers[1]
    moved = [
        (delta(b[0], s.samples()), _diff(b[1], _state(s.gateway)))
        for b, s in zip(befores, (ref, wire), strict=True)
    ]
    assert moved[0] == moved[1]
    return answers[0]


def _state(gateway: Gateway) -> dict[str, Any]:
    parts = gateway.parts
    assert parts.capacity is not None
    return {
        "routes": dict(parts.route_table().counts),
        "refused": parts.capacity.refused,
        "held": parts.capacity.held,
        "rejected": parts.limiter.rejected,
        "acquired": parts.limiter.acquired,
        "inflight": parts.limiter.inflight,
        "queued": parts.queue.total,
    }


def _diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: (before[k], v) for k, v in after.items() if v != before[k]}


def test_the_gateway_form_installs_the_wire_protocol_and_false_turns_it_off() -> None:
    """The gateway's server protocol is the wire one by default, the guarded one when off."""
    env = {"BALLAST_UPSTREAM": "http://u.test"}
    on = Gateway(load_config(env=env), env={})
    off = Gateway(load_config(env=env, overrides={"server": {"shed_at_wire": False}}), env={})
    http_on = uvicorn_settings(on.config.server, None, on.server_protocol)["http"]
    http_off = uvicorn_settings(off.config.server, None, off.server_protocol)["http"]
    assert issubclass(http_on, WireShedProtocol)
    assert not issubclass(http_off, WireShedProtocol)


@pytest.mark.parametrize(
    "request_bytes",
    [
        DOA,
        b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nX-Priority: critical\r\n\r\n",
        b"GET /b/c?q=1 HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nX-Priority: bulk\r\n\r\n",
        b"GET /%7Eu HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\n\r\n",
    ],
)
def test_dead_on_arrival_is_the_same_shed_without_an_asgi_call(request_bytes: bytes) -> None:
    """deadline: same bytes and counts; the wire side never calls the app."""
    with pair() as (ref, wire):
        answer = same(ref, wire, request_bytes * 3, 3)
        assert answer.count(b"x-ballast-reason: deadline") == 3
        assert ref.gateway.calls == 3 and wire.gateway.calls == 0


def test_head_http10_and_connection_close_are_framed_as_uvicorn_frames_them() -> None:
    """HEAD gets no body; HTTP/1.0 and Connection: close get connection: close and a close."""
    with pair() as (ref, wire):
        head = same(ref, wire, DOA.replace(b"GET", b"HEAD"), 1, head=True)
        assert head.endswith(b"\r\n\r\n") and b"content-length: 76" in head
        for closing in (
            b"GET /a HTTP/1.0\r\nX-Deadline-Ms: 0\r\n\r\n",
            b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\nX-Deadline-Ms: 0\r\n\r\n",
            DOA.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + PLAIN,
        ):
            answers = []
            for side in (ref, wire):
                with socket.create_connection(("127.0.0.1", side.port), timeout=5) as sock:
                    sock.sendall(closing)
                    answers.append(read_to_close(sock))
            assert answers[0] == answers[1]
            assert answers[0].count(b"HTTP/1.1") == 1 and b"connection: close\r\n" in answers[0]
        assert wire.gateway.calls == 0


def test_pipelined_requests_after_a_shed_are_answered_in_order() -> None:
    """Shed, proxied, shed, proxied on one connection: the same four answers in order."""
    with pair() as (ref, wire):
        answer = same(ref, wire, DOA + PLAIN + DOA + PLAIN, 4)
        assert [answer.find(b"429"), answer.find(b"200 OK")] == sorted(
            [answer.find(b"429"), answer.find(b"200 OK")]
        )
        assert answer.count(b"HTTP/1.1 200 OK") == 2
        # The first shed at the wire; the second waits behind the proxied request (ASGI way).
        assert wire.gateway.calls == 3


@pytest.mark.parametrize(
    "body_request",
    [
        b"POST /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nContent-Length: 10\r\n\r\n0123456789",
        b"POST /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n",
        # Trailers after a chunked body: dropped, never the next request's headers.
        b"POST /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\nX-Deadline-Ms: 0\r\nX-Priority: critical\r\n\r\n",
        # A body that looks like a request: never parsed as one (no smuggling).
        b"POST /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nContent-Length: %d\r\n\r\n%s"
        % (len(DOA), DOA),
    ],
)
def test_a_body_after_a_shed_head_is_read_and_dropped(body_request: bytes) -> None:
    """The body is drained by its own framing; the request after it is the next one."""
    with pair() as (ref, wire):
        answer = same(ref, wire, body_request + PLAIN, 2)
        assert answer.count(b"HTTP/1.1 429") == 1 and answer.count(b"HTTP/1.1 200") == 1


def test_a_body_arriving_after_the_shed_then_the_next_request() -> None:
    """The shed is answered at its head; the body's bytes come later, then a request."""
    head = b"POST /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nContent-Length: 6\r\n\r\n"
    with pair() as (ref, wire):
        answers = []
        for side in (ref, wire):
            with socket.create_connection(("127.0.0.1", side.port), timeout=5) as sock:
                sock.sendall(head)
                first = read_responses(sock, 1)
                sock.sendall(b"abc")
                sock.sendall(b"def" + PLAIN)
                answers.append(first + read_responses(sock, 1))
        assert answers[0] == answers[1] and b"HTTP/1.1 200" in answers[0]


def test_connection_close_with_a_body_still_coming_closes_lingering() -> None:
    """The answer arrives whole, then a FIN while the client may still send its body."""
    head = b"POST /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nConnection: close\r\n"
    head += b"Content-Length: 100000\r\n\r\n"
    with pair() as (ref, wire):
        answers = []
        for side in (ref, wire):
            with socket.create_connection(("127.0.0.1", side.port), timeout=5) as sock:
                sock.sendall(head + b"x" * 1000)
                answer = read_to_close(sock)
                sock.sendall(b"y" * 1000)  # still accepted: the server reads and drops
                answers.append(answer)
        assert answers[0] == answers[1] and b"connection: close" in answers[0]


def test_hostile_heads_go_the_ordinary_way_with_the_same_answers() -> None:
    """Too many headers, a huge head, a malformed deadline, an absolute target: same bytes."""
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(150))
    cases = [
        (b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\n" + many + b"\r\n", 1),
        (b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: nope\r\n\r\n", 1),
        (b"GET http://evil/a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\n\r\n", 1),
        (b"GET /a HTTP/1.1\r\nHost: t\r\nHost: u\r\nX-Deadline-Ms: 0\r\n\r\n", 1),
    ]
    with pair() as (ref, wire):
        for data, count in cases:
            answers = []
            for side in (ref, wire):
                with socket.create_connection(("127.0.0.1", side.port), timeout=5) as sock:
                    sock.sendall(data)
                    # the answers, not the close: a kept-alive 4xx closes only at the
                    # keep-alive timeout, as long as this socket's own timeout (a race)
                    answers.append(read_responses(sock, count))
            assert answers[0] == answers[1] and answers[0].count(b"HTTP/1.1 4") == count
        big = b"GET /a HTTP/1.1\r\nX-Deadline-Ms: 0\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
        answers = []
        for side in (ref, wire):
            with socket.create_connection(("127.0.0.1", side.port), timeout=5) as sock:
                sock.sendall(big)
                answers.append(read_to_close(sock))
        assert answers[0] == answers[1] and answers[0].startswith(b"HTTP/1.1 431")


def test_a_head_sent_byte_by_byte_is_shed_once_complete() -> None:
    """A slow head (one byte per write) is decided only when complete, once."""
    with pair() as (ref, wire):
        answers = []
        for side in (ref, wire):
            with socket.create_connection(("127.0.0.1", side.port), timeout=5) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for i in range(len(DOA)):
                    sock.sendall(DOA[i : i + 1])
                answers.append(read_responses(sock, 1))
        assert answers[0] == answers[1] and b"x-ballast-reason: deadline" in answers[0]
        assert wire.gateway.calls == 0


def test_a_client_that_pipelines_sheds_without_reading_gets_every_answer() -> None:
    """Thousands of pipelined sheds, read only at the end: all answered, in order."""
    with pair() as (ref, wire):
        answer = wire.exchange(DOA * 5000, 5000)
        assert answer.count(b"HTTP/1.1 429") == 5000
        assert answer == ref.exchange(DOA * 5000, 5000)


def test_dry_run_counts_and_admits() -> None:
    """Dry-run: a dead-on-arrival request goes upstream on both, counted as would-shed."""
    with pair(load_shed_dry_run=True) as (ref, wire):
        answer = same(ref, wire, DOA, 1)
        assert answer.startswith(b"HTTP/1.1 200") and wire.gateway.calls == 1


def test_early_drop_is_the_same_shed() -> None:
    """early_drop: a budget below the minimum service time, the same at the wire."""
    with pair(admission={"early_drop": True}) as (ref, wire):
        for side in (ref, wire):
            side.gateway.parts.limiter._rtt_min.add(0.5, side.gateway.clock())
        request = b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 100\r\n\r\n"
        assert b"x-ballast-reason: early_drop" in same(ref, wire, request * 2, 2)
        assert wire.gateway.calls == 0


def test_capacity_is_the_same_shed() -> None:
    """capacity: the held-requests cap reached; critical keeps its reserve."""
    with pair(capacity={"max_held_requests": 10}) as (ref, wire):
        for side in (ref, wire):
            cap = side.gateway.parts.capacity
            assert cap is not None
            cap.held = 9  # the non-critical share is full, the critical reserve is not
        answer = same(
            ref, wire, PLAIN + PLAIN.replace(b"\r\n\r\n", b"\r\nX-Priority: critical\r\n\r\n"), 2
        )
        assert answer.count(b"x-ballast-reason: capacity") == 1 and b"200 OK" in answer
        assert wire.gateway.calls == 1
        for side in (ref, wire):
            assert side.gateway.parts.capacity is not None
            side.gateway.parts.capacity.held = 0


@contextmanager
def held_permits(*sides: Side) -> Iterator[None]:
    """Every permit of each side's limiter taken, then handed back."""
    taken = []
    for side in sides:
        limiter = side.gateway.parts.limiter
        while (permit := limiter.try_acquire(side.gateway.clock())) is not None:
            taken.append((side, permit))
    try:
        yield
    finally:
        for side, permit in taken:
            permit.release(Outcome.IGNORED, side.gateway.clock())


def test_limit_is_the_same_shed() -> None:
    """limit: no free permit and no queue."""
    with pair(max_concurrent_requests=2, admission_queue={"enabled": False}) as (ref, wire):
        with held_permits(ref, wire):
            answer = same(ref, wire, PLAIN * 2, 2)
        assert answer.count(b"x-ballast-reason: limit") == 2 and wire.gateway.calls == 0


def test_queue_full_is_the_same_shed_and_a_displacement_is_left_to_the_queue() -> None:
    """queue_full: full of critical waiters, a standard request is refused at the wire."""
    with pair(max_concurrent_requests=1, admission_queue={"max_queue_size": 1}) as (ref, wire):
        with held_permits(ref, wire):
            waiters = []
            for side in (ref, wire):
                waiter = Waiter(Priority.CRITICAL, side.gateway.clock())
                assert side.gateway.parts.queue.push(waiter).accepted
                waiters.append((side, waiter))
            answer = same(ref, wire, PLAIN * 2, 2)
            for side, waiter in waiters:
                side.gateway.parts.queue.remove(waiter)
        assert answer.count(b"x-ballast-reason: queue_full") == 2 and wire.gateway.calls == 0


@pytest.mark.parametrize("retry", [False, True])
def test_breaker_open_is_the_same_shed(retry: bool) -> None:
    """breaker_open: at the wire without retries; with them the ASGI path, same bytes."""
    with pair(retry={"enabled": retry}) as (ref, wire):
        for side in (ref, wire):
            for key in (None, "other", "/a"):  # the default and the routes /a may be on
                breaker = side.gateway.parts.breakers.get(key)
                breaker._enter(BreakerState.OPEN, side.gateway.clock())
        answer = same(ref, wire, PLAIN * 2, 2)
        assert answer.count(b"x-ballast-reason: breaker_open") == 2
        assert wire.gateway.calls == (2 if retry else 0)


def test_rate_limited_goes_the_ordinary_way_with_the_same_answer() -> None:
    """rate_limited (keyed from the scope): decided by its stage on both sides, same bytes."""
    limits = {"enabled": True, "rate_per_s": 0.01, "burst": 1}
    with pair(rate_limit=limits) as (ref, wire):
        answer = same(ref, wire, PLAIN * 3, 3)
        assert answer.count(b"x-ballast-reason: rate_limited") == 2


def test_admin_paths_are_never_decided_at_the_wire() -> None:
    """A dead-on-arrival request to the admin prefix is the admin's (health answers)."""
    with pair() as (ref, wire):
        request = b"GET /_ballast/health HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\n\r\n"
        assert same(ref, wire, request, 1).startswith(b"HTTP/1.1 200")


def test_a_request_that_is_not_shed_is_read_once(request: pytest.FixtureRequest) -> None:
    """The head the wire read (and did not shed) is the one admission uses: one read.
    (Counted by a patched method: on the sources, ``on_the_sources``.)"""
    from tests.pure import on_the_sources

    if not on_the_sources(request.node.nodeid):
        return
    with pair() as (ref, wire):
        reads = []
        for side in (ref, wire):
            stack = side.gateway._stack
            assert stack is not None
            admission = stack.stages.admission.stage  # type: ignore[attr-defined]
            calls: list[int] = []
            original = admission.read

            def counted(
                *args: Any, _calls: list[int] = calls, _read: Any = original, **kw: Any
            ) -> Any:
                _calls.append(1)
                return _read(*args, **kw)

            admission.read = counted
            reads.append(calls)
        answer = same(ref, wire, PLAIN * 3, 3)
        assert answer.count(b"HTTP/1.1 200") == 3
        assert [len(r) for r in reads] == [3, 3]


def test_uvicorn_importing_the_gateway_gets_the_wire_protocol() -> None:
    """``uvicorn ballast_asgi.gateway:app``: the adopted config's protocol is the wire one."""
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from ballast_asgi.server.serve import adopt_uvicorn

    for on in (True, False):
        overrides = {"server": {"shed_at_wire": on}}
        gateway = Gateway(
            load_config(env={"BALLAST_UPSTREAM": "http://u.test"}, overrides=overrides), env={}
        )
        config = uvicorn.Config(gateway)
        config.http_protocol_class = HttpToolsProtocol  # what load() sets before importing

        def load(
            self: uvicorn.Config = config, gateway: Gateway = gateway
        ) -> bool:  # ``self``: the config
            return adopt_uvicorn(gateway, sys._getframe())

        assert load()
        assert issubclass(config.http_protocol_class, WireShedProtocol) is on


def test_an_idle_connection_is_closed_after_the_keep_alive_time() -> None:
    """After a shed and after a proxied answer alike, an idle connection is closed, and
    a connection that keeps sending is not (the lazy keep-alive timer)."""
    with pair(server={"keep_alive_ms": 1000}) as (ref, wire), ExitStack() as stack:
        # The four idle connections (each side, a shed and a proxied answer) wait at once.
        idle = []
        for side in (ref, wire):
            for request in (DOA, PLAIN):
                sock = stack.enter_context(socket.create_connection(("127.0.0.1", side.port), 5))
                sock.sendall(request)
                read_responses(sock, 1)
                idle.append((sock, time.monotonic()))
        for sock, began in idle:
            assert read_to_close(sock) == b""  # closed by the server, not the timeout
            assert time.monotonic() - began < 5
        # Both sides' busy connections keep sending side by side.
        busy = [
            stack.enter_context(socket.create_connection(("127.0.0.1", side.port), 5))
            for side in (ref, wire)
        ]
        for _ in range(5):  # 5 x 0.3 s: longer than 1 s in all, never idle that long
            for sock in busy:
                sock.sendall(DOA)
                read_responses(sock, 1)
            time.sleep(0.3)
        for sock in busy:
            sock.sendall(PLAIN)
            assert b"HTTP/1.1 200" in read_responses(sock, 1)


@pytest.mark.parametrize(
    "data",
    [
        # Expect: 100-continue on a shed with a body: no 100, the shed, the body dropped.
        b"POST /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nExpect: 100-continue\r\n"
        b"Content-Length: 3\r\n\r\nabc" + PLAIN,
        # HEAD with Connection: close; then nothing more is answered.
        b"HEAD /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nConnection: close\r\n\r\n" + DOA,
        # HTTP/1.0 shed, then a pipelined request: never answered.
        b"GET /a HTTP/1.0\r\nX-Deadline-Ms: 0\r\n\r\n" + PLAIN,
        # A websocket upgrade with a spent deadline: never decided at the wire.
        b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nConnection: Upgrade\r\n"
        b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: "
        b"dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        # An unknown upgrade and a body: the stages' 400 (never switched).
        b"POST /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nConnection: upgrade\r\n"
        b"Upgrade: h2c\r\nContent-Length: 2\r\n\r\nhi",
        # A target with dot segments and an encoded slash, then a huge query.
        b"GET /a/../b%2Fc?"
        + b"q" * 8000
        + b" HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\n\r\n"
        + PLAIN,
        # Deadline with spaces, a negative and a huge value (the stages' 400s, or a shed).
        b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms:  0 \r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: -5\r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 99999999999999999999\r\n\r\n",
        # Header names in any case, values with trailing spaces and tabs (the wire's own
        # ``on_header``: lower-cased names, trailing OWS stripped as uvicorn does), then an
        # Expect in mixed case on a request that is not shed.
        b"GET /a HTTP/1.1\r\nHOST: t\r\nx-DEADLINE-ms: 0 \t\r\nX-PRIORITY: critical\t\r\n\r\n"
        + b"POST /a HTTP/1.1\r\nHost: t\r\nEXPECT: 100-Continue \r\nContent-Length: 2\r\n\r\nhi",
        # A head over server.max_header_bytes (431, the fused read's size check); a
        # request line httptools refuses (uvicorn's 400).
        b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nX-Big: " + b"x" * 70_000 + b"\r\n\r\n",
        b"GET /a HTTP/1.1 junk\r\nHost: t\r\nX-Deadline-Ms: 0\r\n\r\n",
        # Two X-Deadline-Ms that disagree, and CONNECT in authority form.
        b"GET /a HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\nX-Deadline-Ms: 5\r\n\r\n",
        b"CONNECT t:443 HTTP/1.1\r\nHost: t\r\nX-Deadline-Ms: 0\r\n\r\n",
    ],
)
def test_more_hostile_input_gets_the_same_bytes(data: bytes) -> None:
    """Whatever the client sends after or around a shed head: the same bytes, then the
    same close, on both paths."""
    # The server closes (a closing answer, or a short keep-alive once every answer is out):
    # a client's FIN right after its bytes would race the answers still being written.
    with pair(server={"keep_alive_ms": 300}) as (ref, wire):
        answers = []
        for side in (ref, wire):
            with socket.create_connection(("127.0.0.1", side.port), timeout=5) as sock:
                sock.sendall(data)
                answers.append(read_to_close(sock))
        assert answers[0] == answers[1]
        assert answers[0].startswith(b"HTTP/1.1 ")


def test_garbage_after_a_shed_in_the_same_read_the_shed_is_answered_first() -> None:
    """The one difference by design: a well-formed shed head then garbage in one read.
    uvicorn writes its 400 while parsing, before the first request's task runs, so the
    ASGI path never answers the first request; the wire answers it, then the 400."""
    data = DOA + b"\x00\x01 NOT HTTP\r\n\r\n"
    with pair() as (ref, wire):
        answers = []
        for side in (ref, wire):
            with socket.create_connection(("127.0.0.1", side.port), timeout=5) as sock:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
                answers.append(read_to_close(sock))
        bad = answers[0]
        assert bad.startswith(b"HTTP/1.1 400 ") and bad.count(b"HTTP/1.1") == 1
        shed = ref.exchange(DOA, 1)
        assert answers[1] == shed + bad


class BrokenWireGateway(CountingGateway):
    """A gateway whose decision at the wire raises (a bug)."""

    def shed_at_wire(self, *args: Any, **kw: Any) -> Any:
        raise RuntimeError("boom")


def test_a_failing_decision_at_the_wire_leaves_the_request_to_the_asgi_path(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """An exception in the decision is logged and the request answered the ordinary way."""
    with serving(upstream, lifespan="off") as up:
        config = load_config(env={"BALLAST_UPSTREAM": f"http://127.0.0.1:{up}"})
        gateway = BrokenWireGateway(config, env={})
        gateway.server_may_rewrite = False
        settings = uvicorn_settings(config.server, config.websocket, gateway.server_protocol)
        with serving(gateway, **{**settings, "access_log": False, "log_level": "error"}) as port:
            side = Side(port, gateway)
            answer = side.exchange(DOA + PLAIN, 2)
    assert answer.startswith(b"HTTP/1.1 429") and b"HTTP/1.1 200" in answer
    assert gateway.calls == 2
    assert "shed at the wire failed" in capfd.readouterr().err
