"""The lane (ADR 0020) answers exactly as the ASGI path: bytes, upstream traffic, counters.

One script of requests, each with a scripted upstream answer, is played through
the gateway's own server protocol twice (``tests/gateway/lane_rig.py``): with
``server.lane: true`` and with ``false``. Every step's response bytes, every
request the upstream saw and the final metrics must be equal; the lane arm must
have served the common steps itself (no ASGI task), and handed the others on.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ballast_asgi.proxy.body import UNTIMED_BYTES
from tests.gateway.lane_rig import CLOSE, LaneRig

pytestmark = pytest.mark.anyio

BODY = b"x" * 1024


def _resp(status: int, body: bytes = b"", *headers: bytes, length: bool = True) -> bytes:
    reason = {200: b"OK", 204: b"No Content", 302: b"Found", 304: b"Not Modified",
              404: b"Not Found", 500: b"Internal Server Error",
              503: b"Service Unavailable"}[status]  # fmt: skip
    head = [b"HTTP/1.1 %d %s" % (status, reason), b"Server: up", b"Content-Type: text/plain",
            *headers]  # fmt: skip
    if length:
        head.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def upstream(request: bytes, earlier: list[bytes]) -> list[bytes]:
    """The scripted upstream: the answer by the request's path (``earlier``: what it saw)."""
    target = request.split(b" ", 2)[1]
    path = target.split(b"?")[0]
    if path == b"/ok":
        return [_resp(200, BODY)]
    if path == b"/split":  # head and body in two reads (uvicorn upstreams do this)
        whole = _resp(200, BODY)
        cut = whole.index(b"\r\n\r\n") + 4
        return [whole[:cut], whole[cut : cut + 100], whole[cut + 100 :]]
    if path == b"/chunked":
        return [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"]
    if path == b"/big":
        body = b"b" * (UNTIMED_BYTES + 1)
        whole = _resp(200, body)
        return [whole[:5000], whole[5000:]]
    if path == b"/flaky":  # 503 first, then fine: the retry stage retries it
        again = bool(earlier) and earlier[-1].startswith(b"GET /flaky")
        return [_resp(200, b"second")] if again else [_resp(503, b"busy")]
    if path == b"/head":
        return [_resp(200, b"", b"Content-Length: 1024", length=False)]
    if path == b"/204":
        return [_resp(204, length=False)]
    if path == b"/304":
        return [_resp(304, length=False)]
    if path == b"/404":
        return [_resp(404, b"nope")]
    if path == b"/500":
        return [_resp(500, b"boom")]
    if path == b"/redirect":
        return [_resp(302, b"moved", b"Location: http://127.0.0.1:9/ok")]
    if path == b"/empty":
        return [_resp(200, b"")]
    if path == b"/close-head":
        return [CLOSE]
    if path == b"/close-body":
        whole = _resp(200, BODY)
        return [whole[:200], CLOSE]
    if path == b"/bad-status":
        return [b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n"]
    if path == b"/control":
        return [b"HTTP/1.1 200 OK\r\nX-Bad: a\x01b\r\nContent-Length: 2\r\n\r\nok"]
    if path == b"/lying-length":
        return [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokay"]
    if path == b"/garbage-after":
        return [_resp(200, b"fine") + b"HTTP/1.1 200 OK\r\n\r\n"]
    return [_resp(200, b"default")]


def get(path: str, *headers: str, method: str = "GET", version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "Host: gw.test", *headers, "", ""]
    return "\r\n".join(lines).encode()


#: (request bytes, served in the lane by itself: no ASGI task in the lane arm).
SCRIPT: list[tuple[bytes, bool]] = [
    (get("/ok"), True),
    (get("/ok?q=1&r=%20"), True),
    (get("/split"), True),
    (get("/ok", "X-Priority: critical", "X-Forwarded-For: 10.0.0.1"), True),
    (get("/ok", "X-Deadline-Ms: 5000"), True),
    (get("/ok", "Connection: keep-alive, X-Drop", "X-Drop: 1"), True),
    (get("/ok", "Content-Length: 0"), True),
    (get("/404"), True),
    (get("/redirect"), True),
    (get("/empty"), True),  # Content-Length: 0
    (get("/garbage-after"), True),  # more bytes after a whole response: answered, not reused
    (get("/lying-length"), True),  # a Content-Length shorter than the body: the same
    (get("/ok"), False),  # (the pool's connections went with them: a new one, as ever)
    (get("/ok", "Expect: 100-continue"), False),  # the proxy's ``receive`` answers the 100
    (get("/chunked"), False),
    (get("/big"), False),
    (get("/flaky?try=1"), False),
    (get("/204"), True),
    (get("/304"), True),
    (get("/head", method="HEAD"), True),  # (a connection that answered HEAD is not reused)
    (get("/ok"), False),  # ... and the flaky one's retry took the other: the proxy connects
    (get("/500"), False),
    (get("/close-body"), False),
    (get("/close-head"), False),
    (get("/bad-status"), False),
    (get("/control"), False),
    (get("/garbage-after"), False),  # the failures closed every idle connection: a new one
    (get("/ok"), False),  # ... and garbage makes it unusable: the proxy connects again
    (get("/ok"), True),
    (get("/ok", "X-Deadline-Ms: 0"), True),  # shed at the wire (no task either way)
    (b"POST /ok HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 3\r\n\r\nabc", False),
    (get("/ok") + get("/split"), False),  # pipelined: the second waits for the first
    (get("/ok", "X-Priority: bogus"), False),  # 400 from admission (a task on either arm)
    (get("/ok"), True),
    (get("/_ballast/health"), False),  # the admin prefix: the admin router's, never the lane's
    (get("/ok", "Connection: close"), True),  # answered, then the connection closes
    (get("/ok", version="1.0"), True),  # HTTP/1.0: the same, on a new connection
    (get("/split", version="1.0"), True),
]


async def _play(lane: bool, script: list[tuple[bytes, bool]], config: dict[str, Any] | None = None
                ) -> tuple[list[Any], LaneRig]:  # fmt: skip
    rig = LaneRig(upstream, lane=lane, config=config)
    await rig.start()
    transcript: list[Any] = []
    for raw, laned in script:
        tasks = rig.tasks
        answer = await rig.send(raw)
        transcript.append((raw, answer, rig.client.closed))
        if lane and laned:
            assert rig.tasks == tasks, f"the lane handed {raw!r} on"
        if rig.client.closed:
            rig.connect()
    return transcript, rig


async def test_the_lane_answers_the_script_as_the_asgi_path() -> None:
    """Every step's bytes, the upstream's requests and the counters are equal on both arms."""
    asgi, off = await _play(False, SCRIPT)
    laned, on = await _play(True, SCRIPT)
    for a, b in zip(asgi, laned, strict=True):
        assert a == b
    assert off.seen == on.seen
    assert off.metrics() == on.metrics()
    assert on.tasks < off.tasks  # the lane did serve requests itself
    for rig in (off, on):  # nothing held once every response is out
        parts = rig.gw.pieces.parts
        assert parts.limiter.inflight == 0
        assert parts.capacity is not None and parts.capacity.held == 0
        assert rig.pool.in_use == 0


async def _leave_while_the_upstream_works(lane: bool) -> list[str]:
    """The client leaves before an upstream that never answers does: checked, the metrics."""
    rig = LaneRig(lambda request, earlier: [], lane=lane)
    await rig.start()
    rig.protocol.data_received(get("/ok"))
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(rig.seen) == 1 and rig.tasks == (0 if lane else 1)
    (conn,) = [c for c in rig.conns if c.exchange is not None]
    rig.protocol.connection_lost(None)
    assert conn.closed or not lane  # the lane's: at once, from the server's callback
    for _ in range(20):
        await asyncio.sleep(0)
    assert conn.closed  # the ASGI path's: its task cancelled where it awaits the head
    assert rig.client.out == []
    parts = rig.gw.pieces.parts
    assert parts.limiter.inflight == 0 and parts.capacity is not None
    assert parts.capacity.held == 0 and rig.pool.in_use == 0
    assert rig.tasks == 1  # the lane hands the end to the ASGI path (ClientGone)
    return rig.metrics()


async def test_a_client_gone_while_the_upstream_works_ends_the_exchange() -> None:
    """The client leaves before the upstream answers: on either path the upstream connection
    is closed at once (the upstream's work is not waited for until the deadline), nothing
    is written, the permit, slot and connection are released, and no upstream error, RTT
    or breaker failure is counted (``client_gone`` is neutral): the same metrics."""
    lines = await _leave_while_the_upstream_works(True)
    assert lines == await _leave_while_the_upstream_works(False)
    counted = [line for line in lines if not line.endswith(" 0.0")]
    assert 'ballast_requests_total{priority="standard"} 1.0' in counted
    assert not any(
        line.startswith(("ballast_upstream_errors", "ballast_upstream_latency_seconds_count"))
        for line in counted
    ), counted


@pytest.mark.parametrize("lane", [True, False])
async def test_a_client_gone_during_a_pipelined_request_ends_it(lane: bool) -> None:
    """Two requests pipelined, the first answered, the second's upstream never answers, a
    third queued behind it; the client leaves: the request in service (not the newest
    cycle, which is the queued one) ends at once, its upstream connection closed,
    nothing held."""

    def upstream(request: bytes, earlier: list[bytes]) -> list[bytes]:
        return [_resp(200, BODY)] if b"/ok" in request else []

    rig = LaneRig(upstream, lane=lane)
    await rig.start()
    rig.protocol.data_received(get("/ok") + get("/hold") + get("/ok"))
    for _ in range(50):
        await asyncio.sleep(0)
    assert rig.client.out and len(rig.seen) == 2  # the first answered, the second sent
    (conn,) = [c for c in rig.conns if c.exchange is not None]
    rig.protocol.connection_lost(None)
    for _ in range(20):
        await asyncio.sleep(0)
    assert conn.closed
    parts = rig.gw.pieces.parts
    assert parts.limiter.inflight == 0 and parts.capacity is not None
    assert parts.capacity.held == 0 and rig.pool.in_use == 0 and len(rig.seen) == 2


@pytest.mark.parametrize("lane", [True, False])
async def test_a_client_gone_during_the_retry_backoff_gets_no_second_attempt(lane: bool) -> None:
    """A 503 the retry stage would retry after a backoff; the client leaves during the
    backoff: the backoff ends at once, no second upstream request, nothing held, the
    granted retry given back (the rule: a client that disconnects costs no upstream work)."""

    def upstream(request: bytes, earlier: list[bytes]) -> list[bytes]:
        return [_resp(503, b"busy")]

    rig = LaneRig(upstream, lane=lane, config={"retry": {"backoff_base_ms": 20}})
    await rig.start()
    stage = rig.gw.stack.direct.stages.retry.stage  # type: ignore[union-attr]
    backoff = asyncio.get_running_loop().create_future()
    waits: list[float] = []

    async def sleep(delay_s: float) -> None:  # the backoff, ended by the test
        waits.append(delay_s)
        await backoff

    stage._sleep = sleep
    rig.protocol.data_received(get("/flaky"))
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(rig.seen) == 1 and waits  # the 503 held, the backoff begun
    rig.protocol.connection_lost(None)
    for _ in range(50):  # the backoff is never ended by the test: the client's leaving ends it
        await asyncio.sleep(0)
    assert backoff.cancelled() and len(rig.seen) == 1
    parts = rig.gw.pieces.parts
    assert parts.limiter.inflight == 0 and parts.capacity is not None
    assert parts.capacity.held == 0 and rig.pool.in_use == 0
    budget = stage._budget.snapshot(0.0)  # the retry granted at the 503 never ran: given back
    assert budget["retries_granted_total"] == 1 and budget["retries_refunded_total"] == 1


async def _leave_before_the_body(lane: bool) -> list[str]:
    """The head is in, the rest of a small body never comes, the client leaves: checked,
    the metrics."""
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
    rig = LaneRig(lambda request, earlier: [head + b"12345"], lane=lane)
    await rig.start()
    rig.protocol.data_received(get("/ok"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert rig.tasks == (0 if lane else 1)  # waiting for the body (the ASGI path streams)
    assert rig.client.out == [] or not lane
    rig.protocol.connection_lost(None)
    written = len(rig.client.out)
    for _ in range(20):
        await asyncio.sleep(0)
    assert rig.tasks == 1 and len(rig.client.out) == written  # nothing after the leave
    parts = rig.gw.pieces.parts
    assert parts.limiter.inflight == 0 and parts.capacity is not None
    assert parts.capacity.held == 0 and rig.pool.in_use == 0
    assert all(c.closed for c in rig.conns if c.exchange is not None or c in rig.pool.idle)
    return rig.metrics()


async def test_a_client_gone_before_the_body_ends_both_paths_alike() -> None:
    """The head is in and the client leaves while the body is awaited: the lane hands the
    response on and the ASGI path (its relay's wait cancelled by ``ResponseCycle.stop``)
    ends it as it ends its own: the attempt recorded at its head, nothing more written,
    everything released, the upstream connection closed; the same metrics."""
    lines = await _leave_before_the_body(True)
    assert lines == await _leave_before_the_body(False)
    assert "ballast_upstream_latency_seconds_count 1.0" in lines, lines


async def test_a_client_that_does_not_read_gets_its_answer_from_the_asgi_path() -> None:
    """The client's transport is paused for writing when the answer comes: the lane hands it
    to the ASGI path, whose ``send`` waits for the drain (the same bytes once it drains)."""
    rig = LaneRig(upstream, lane=True)
    await rig.start()
    rig.protocol.data_received(get("/ok"))
    rig.protocol.pause_writing()  # before the upstream's answer (a later loop turn)
    for _ in range(20):
        await asyncio.sleep(0)
    assert rig.client.out == [] and rig.tasks == 1  # handed on, waiting for the drain
    rig.protocol.resume_writing()
    for _ in range(20):
        await asyncio.sleep(0)
    answer = b"".join(rig.client.out)
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(BODY)
    assert rig.gw.pieces.parts.limiter.inflight == 0


async def test_the_script_is_not_trivial() -> None:
    """The script's answers are what a proxy owes them (so equality above means something)."""
    transcript, rig = await _play(True, SCRIPT)
    answers = {raw: answer for raw, answer, _ in transcript}
    closed = {raw: gone for raw, _, gone in transcript}
    for raw in (get("/ok", "Connection: close"), get("/ok", version="1.0")):
        assert b"connection: close\r\n" in answers[raw] and answers[raw].endswith(BODY)
        assert closed[raw]
    assert answers[get("/ok")].startswith(b"HTTP/1.1 200 OK\r\n")
    assert answers[get("/ok")].endswith(BODY)
    assert answers[get("/split")].endswith(BODY)
    assert b"location: http://gw.test/ok" in answers[get("/redirect")]
    assert answers[get("/flaky?try=1")].endswith(b"second")  # retried
    assert answers[get("/close-head")].startswith(b"HTTP/1.1 502 ")
    assert answers[get("/bad-status")].startswith(b"HTTP/1.1 502 ")
    assert answers[get("/control")].startswith(b"HTTP/1.1 502 ")
    assert answers[get("/chunked")].endswith(b"5\r\nhello\r\n0\r\n\r\n")
    assert answers[get("/big")].endswith(b"b" * 100)
    assert b"x-ballast-reason: deadline" in answers[get("/ok", "X-Deadline-Ms: 0")]
    assert answers[get("/ok") + get("/split")].count(b"HTTP/1.1 200 OK") == 2
    forwarded = [r for r in rig.seen if b"x-priority: critical" in r.lower()]
    assert forwarded and b"x-forwarded-for: 10.0.0.1, 127.0.0.1" in forwarded[0].lower()
    assert all(b"x-drop" not in r.lower() for r in rig.seen)


@pytest.mark.parametrize(
    "config",
    [
        {"retry": {"enabled": False}},
        {"admission_queue": {"enabled": False}},
        {"breaker": {"consecutive_failures": 1, "min_calls": 1, "failure_ratio": 0.1}},
        {"proxy": {"preserve_host": True}},
        {"server": {"shed_at_wire": False}},
    ],
    ids=["no-retry", "no-queue", "touchy-breaker", "preserve-host", "no-wire-shed"],
)
async def test_the_lane_equals_the_asgi_path_in_other_configs(config: dict[str, Any]) -> None:
    """The same equality with retries off, no queue, a breaker that opens, Host preserved,
    and without the shed at the wire (the lane then reads the head itself)."""
    script = [(raw, False) for raw, _ in SCRIPT]  # what the lane serves differs by config
    asgi, off = await _play(False, script, config)
    laned, on = await _play(True, script, config)
    for a, b in zip(asgi, laned, strict=True):
        assert a == b
    assert off.seen == on.seen
    assert off.metrics() == on.metrics()


async def test_the_lane_records_the_attempt_as_the_proxy_does() -> None:
    """What the lane records at the head: the outcome, the time to the head as the RTT (and
    in ``upstream_latency``), the upstream tried; the body taken whole."""
    from ballast_asgi.core.outcome import AttemptOutcome
    from ballast_asgi.middleware.concurrency import finish
    from ballast_asgi.proxy.laned import LanedProxy
    from ballast_asgi.proxy.transports.lean_wire import LeanResponse

    rig = LaneRig(upstream, lane=True)
    await rig.start()
    proxy = LanedProxy(rig.gw.pieces.proxy_app)
    ctx, scope, permit = rig.gw.stack.direct.enter(
        {"type": "http", "method": "GET", "path": "/ok", "raw_path": b"/ok", "root_path": "",
         "query_string": b"", "headers": [(b"host", b"gw.test")], "client": ("10.1.2.3", 9),
         "server": ("127.0.0.1", 8080), "scheme": "http", "state": {}}
    )  # fmt: skip
    told: list[Any] = []
    begun = proxy.begin(scope, ctx, told.append)
    assert begun is not None
    response, up, started = begun
    assert isinstance(response, LeanResponse)
    response.feed(_resp(200, BODY))
    assert told == [None]
    checked = proxy.check(scope, response)
    assert checked is not None
    answer = proxy.answer(scope, ctx, (response, up, started, started + 0.25), checked, True)
    assert answer is not None and answer[0] == 200 and answer[2] == BODY
    assert ctx.outcome is AttemptOutcome.SUCCESS and ctx.rtt_s == 0.25
    assert ctx.tried_upstreams == (up,)
    latency = rig.registry.get_sample_value("ballast_upstream_latency_seconds_sum")
    assert latency == 0.25
    finish(permit, ctx, rig.clock())  # what the lane does next (``_Exchange.told``)
    rig.gw.pieces.parts.capacity.leave()  # type: ignore[union-attr]


async def test_a_bug_in_the_lane_costs_one_500_and_leaks_nothing(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """The lane raising after the stages gave a permit: uvicorn's 500 (as ``run_asgi`` answers
    an app that raised), nothing sent upstream, the permit and the slot released.
    (The bug is a patched method: run on the sources, ``on_the_sources``.)"""
    from ballast_asgi.proxy.laned import LanedProxy
    from tests.pure import on_the_sources

    if not on_the_sources(request.node.nodeid):
        return

    def broken(*args: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(LanedProxy, "begin", broken)
    rig = LaneRig(upstream, lane=True)
    await rig.start()
    answer = await rig.send(get("/ok"))
    assert answer.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert rig.seen == [] and rig.tasks == 0
    parts = rig.gw.pieces.parts
    assert parts.limiter.inflight == 0 and parts.capacity is not None
    assert parts.capacity.held == 0
