"""The proxied lane (ADR 0020) against the ASGI path: the same raw bytes, the same everything.

Each test plays one client script (raw sockets) through two real gateways in
front of one raw upstream (``lane_harness``): ``server.lane: false`` (every
proxied request through uvicorn's ASGI cycle, the reference) and
``server.lane: true``. ``Pair.same`` asserts that the two arms agree on the
bytes the client read (``date`` lines dropped), how each connection ended
(a probe request answered, or closed), the request heads the upstream read and
on which connection (the warmed pooled one or a new one; ``x-deadline-ms``
within a tolerance) and the deltas of the gateway's counters (requests, sheds,
upstream errors, retries, breaker transitions, histogram counts, the
limiter's and capacity's own counts). A difference fails with both sides
spelled out. The tests also pin what today's ASGI path does, so that both arms
agreeing on something wrong fails too.

Scenarios whose counters could leak into the next (retries spend the retry
budget, failures feed the breaker) get a pair of their own; the well-behaved
ones share one pair.

Longer than 300 lines on purpose: one short test per scenario of issue 31's lane
(ADR 0020), so that a difference names its scenario.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.e2e.support import HANG_S
from tests.server.lane_harness import (
    Arm,
    Client,
    Close,
    Gated,
    Hold,
    Observation,
    Pair,
    Pieces,
    Reply,
    Script,
    lane_pair,
    ok,
    refused_url,
)

pytestmark = pytest.mark.e2e

KB = b"0123456789abcdef" * 64
MIB = bytes(range(256)) * 4096


def get(path: bytes, extra: bytes = b"", method: bytes = b"GET", version: bytes = b"1.1") -> bytes:
    """A request head without a body."""
    return b"%s %s HTTP/%s\r\nHost: t\r\n%s\r\n" % (method, path, version, extra)


def one(request: bytes, *, head: bool = False) -> Script:
    """A script: one connection, one request, its response."""

    def script(arm: Arm) -> list[Client]:
        c = arm.client()
        c.send(request)
        c.response(head=head)
        return [c]

    return script


def wait_until(predicate: Callable[[], bool]) -> bool:
    """Wait (bounded, a hang guard) until ``predicate()`` holds (readiness); whether it did."""
    limit = time.monotonic() + HANG_S
    while not predicate():
        if time.monotonic() > limit:
            return False
        time.sleep(0.002)
    return True


def status(obs: Observation, conn: int = 0, index: int = 0) -> bytes:
    """The status line of one response the client read."""
    return obs.responses[conn][index].split(b"\r\n", 1)[0]


def paths(obs: Observation) -> list[bytes]:
    """The request lines the upstream read, in order."""
    return [head.split(b"\r\n", 1)[0] for _, head in obs.upstream]


@pytest.fixture(scope="module")
def shared() -> Iterator[Pair]:
    """One pair for the scenarios that leave no state behind (no retries, no failures)."""
    with lane_pair() as pair:
        yield pair


@contextmanager
def fresh(
    overrides: dict[str, Any] | None = None, **programs: Reply | tuple[Reply, ...]
) -> Iterator[Pair]:
    """A pair of its own (config ``overrides``) with ``programs`` (path without the slash ->
    replies)."""
    with lane_pair(**(overrides or {})) as pair:
        for name, replies in programs.items():
            replies = replies if isinstance(replies, tuple) else (replies,)
            pair.upstream.program("/" + name, *replies)
        yield pair


def test_a_get_with_a_1_kb_body(shared: Pair) -> None:
    """GET 200 with a 1 KB Content-Length body: the same bytes, heads and counts."""
    shared.upstream.program("/kb", ok(KB))
    obs = shared.same(one(get(b"/kb")))
    assert obs.responses[0][0].endswith(b"\r\n\r\n" + KB)
    assert status(obs) == b"HTTP/1.1 200 OK" and obs.endings == ["open"]
    assert obs.upstream[0][0] == "pooled" and paths(obs) == [b"GET /kb HTTP/1.1"] * 1 + [
        b"GET /probe HTTP/1.1"
    ]


def test_twenty_keep_alive_gets_on_one_connection(shared: Pair) -> None:
    """20 GETs one after another on one connection, each on the pooled upstream connection."""
    shared.upstream.program("/ka", ok(b"again"))

    def script(arm: Arm) -> list[Client]:
        c = arm.client()
        for _ in range(20):
            c.send(get(b"/ka"))
            c.response()
        return [c]

    obs = shared.same(script)
    assert len(obs.responses[0]) == 21 and obs.endings == ["open"]
    assert {conn for conn, _ in obs.upstream} == {"pooled"}


def test_three_pipelined_gets_in_one_write(shared: Pair) -> None:
    """Three GETs in one write: three answers in order, the same upstream traffic."""
    for n in (1, 2, 3):
        shared.upstream.program(f"/p{n}", ok(b"p%d" % n))

    def script(arm: Arm) -> list[Client]:
        c = arm.client()
        c.send(get(b"/p1") + get(b"/p2") + get(b"/p3"))
        for _ in range(3):
            c.response()
        return [c]

    obs = shared.same(script)
    assert [r[-2:] for r in obs.responses[0][:3]] == [b"p1", b"p2", b"p3"]


def test_head(shared: Pair) -> None:
    """HEAD: the upstream's length, no body, the connection kept."""
    shared.upstream.program("/h", b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\n\r\n")
    obs = shared.same(one(get(b"/h", method=b"HEAD"), head=True))
    assert b"content-length: 1024" in obs.responses[0][0].lower()
    assert obs.responses[0][0].endswith(b"\r\n\r\n") and obs.endings == ["open"]


@pytest.mark.parametrize(
    ("code", "reply"),
    [
        (204, b'HTTP/1.1 204 No Content\r\nETag: "x"\r\n\r\n'),
        (304, b'HTTP/1.1 304 Not Modified\r\nETag: "x"\r\n\r\n'),
        (404, ok(b"no such thing", b"404 Not Found")),
    ],
)
def test_bodiless_and_not_found_statuses(shared: Pair, code: int, reply: bytes) -> None:
    """204, 304 (no body) and 404: passed on as they came, the same counts."""
    path = b"/s%d" % code
    shared.upstream.program(path.decode(), reply)
    obs = shared.same(one(get(path)))
    assert status(obs).startswith(b"HTTP/1.1 %d" % code) and obs.endings == ["open"]


def test_an_upstream_chunked_response(shared: Pair) -> None:
    """A chunked upstream body reaches the client chunked, the same bytes on both arms."""
    shared.upstream.program(
        "/chunked",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    obs = shared.same(one(get(b"/chunked")))
    assert b"transfer-encoding: chunked" in obs.responses[0][0].lower()
    assert obs.endings == ["open"]


def test_a_1_mib_response(shared: Pair) -> None:
    """1 MiB with a Content-Length: every byte, in order."""
    shared.upstream.program("/mib", ok(MIB))
    obs = shared.same(one(get(b"/mib")))
    assert obs.responses[0][0].endswith(MIB) and obs.endings == ["open"]


def test_a_redirect_naming_the_upstream_is_rewritten(shared: Pair) -> None:
    """A Location naming the upstream is rewritten the same way on both arms."""
    port = shared.upstream.port
    location = b"Location: http://127.0.0.1:%d/elsewhere?x=1\r\n" % port
    shared.upstream.program("/redir", ok(b"", b"302 Found", location))
    obs = shared.same(one(get(b"/redir")))
    assert status(obs) == b"HTTP/1.1 302 Found"
    assert b"127.0.0.1:%d" % port not in obs.responses[0][0]


def test_priority_and_forwarded_for_are_passed_on(shared: Pair) -> None:
    """X-Priority and X-Forwarded-For reach the upstream as today; counted by tier."""
    shared.upstream.program("/prio", ok())
    extra = b"X-Priority: critical\r\nX-Forwarded-For: 10.1.2.3\r\n"
    obs = shared.same(one(get(b"/prio", extra)))
    head = obs.upstream[0][1].lower()
    assert b"x-priority: critical" in head
    assert b"x-forwarded-for: 10.1.2.3, 127.0.0.1" in head
    assert obs.metrics.get("ballast_requests_total{priority=critical}") == 1


@pytest.mark.parametrize(
    "request_bytes",
    [get(b"/cc", b"Connection: close\r\n"), get(b"/ten", version=b"1.0")],
    ids=["connection-close", "http-1.0"],
)
def test_a_closing_request_gets_its_answer_then_the_close(
    shared: Pair, request_bytes: bytes
) -> None:
    """Connection: close and HTTP/1.0: the response, connection: close, then the close."""
    obs = shared.same(one(request_bytes))
    assert b"connection: close" in obs.responses[0][0] and obs.endings == ["closed"]


@pytest.mark.parametrize(
    ("retry_statuses", "attempts"),
    [(None, 1), ((500, 502, 503, 504), 3)],
    ids=["default", "on-500"],
)
def test_a_500_is_retried_the_same_way(
    retry_statuses: tuple[int, ...] | None, attempts: int
) -> None:
    """An upstream 500: by default not retried (502-504 are); when 500 is listed, three
    attempts. The same attempts upstream, the last 500 to the client, the same counts."""
    overrides = {"retry": {"retry_statuses": retry_statuses}} if retry_statuses else {}
    with fresh(overrides, e500=ok(b"boom", b"500 Internal Server Error")) as pair:
        obs = pair.same(one(get(b"/e500")))
        assert status(obs) == b"HTTP/1.1 500 Internal Server Error"
        assert paths(obs).count(b"GET /e500 HTTP/1.1") == attempts


def test_a_503_then_200_retry_succeeds() -> None:
    """503 then 200: one retry, the 200 to the client, the same counts."""
    with fresh(flaky=(ok(b"busy", b"503 Service Unavailable"), ok(b"fine"))) as pair:
        obs = pair.same(one(get(b"/flaky")))
        assert status(obs) == b"HTTP/1.1 200 OK" and obs.responses[0][0].endswith(b"fine")
        assert paths(obs).count(b"GET /flaky HTTP/1.1") == 2


def test_an_upstream_that_closes_mid_body() -> None:
    """1000 bytes promised, 100 sent, then a close: the same answer and the same close."""
    cut = Close(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 100)
    with fresh(cut=cut) as pair:
        obs = pair.same(one(get(b"/cut")))
        assert obs.responses[0][0].endswith(b"x" * 100 + b"<eof>") and obs.endings == ["closed"]
        assert obs.metrics["ballast_upstream_errors_total{kind=protocol}"] == 1


def test_an_upstream_slower_than_the_deadline_gets_504() -> None:
    """X-Deadline-Ms: 100 and an upstream that never answers: 504, and it is let go."""
    with fresh(slow=Hold()) as pair:

        def script(arm: Arm) -> list[Client]:
            c = arm.client()
            c.send(get(b"/slow", b"X-Deadline-Ms: 100\r\n"))
            c.response()
            let_go = arm.wait_upstream(lambda u: bool(u.closed_by_gateway))
            arm.notes.append(f"upstream connection closed by the gateway: {let_go}")
            return [c]

        obs = pair.same(script)
        assert status(obs) == b"HTTP/1.1 504 Gateway Timeout"
        assert obs.deadlines and all(0 < d <= 100 for d in obs.deadlines)


def test_an_upstream_port_that_refuses_gets_502() -> None:
    """Nothing listens upstream: 502 after the same attempts, the same counts."""
    with lane_pair(upstream_url=refused_url()) as pair:
        obs = pair.same(one(get(b"/nobody")), warm=False)
        assert status(obs) == b"HTTP/1.1 502 Bad Gateway"
        assert obs.metrics.get("ballast_upstream_errors_total{kind=connect}", 0) >= 1


def test_a_client_that_disconnects_before_the_response() -> None:
    """The client leaves while the upstream works (deadline 60 s): on both paths the gateway
    closes the upstream connection then, long before the deadline (the wait is bounded
    by ``READ_TIMEOUT_S``), with the same upstream exchange and the same counts."""
    with fresh(hold=Hold()) as pair:

        def script(arm: Arm) -> list[Client]:
            c = arm.client()
            c.send(get(b"/hold", b"X-Deadline-Ms: 60000\r\n"))
            arm.notes.append(f"upstream got it: {arm.wait_upstream(lambda u: bool(u.received))}")
            c.close()
            let_go = arm.wait_upstream(lambda u: bool(u.closed_by_gateway))
            names = [arm.upstream.conn_name(n) for n in arm.upstream.closed_by_gateway]
            arm.notes.append(f"upstream connection closed by the gateway: {let_go} {names}")
            return []

        obs = pair.same(script)
        assert obs.notes[1].startswith("upstream connection closed by the gateway: True")


MANY = b"".join(b"X-F%d: v\r\n" % i for i in range(200))


def then_after(first: bytes) -> Script:
    """A script: ``first`` then ``GET /after`` on the same connection, both answered."""

    def script(arm: Arm) -> list[Client]:
        c = arm.client()
        c.send(first)
        c.response()
        c.send(get(b"/after"))
        c.response()
        return [c]

    return script


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 abc OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\n" + MANY + b"Content-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\nok\r\n0\r\n\r\n",
    ],
    ids=["bad-status-line", "control-character", "200-fields", "length-and-chunked"],
)
def test_a_malformed_upstream_response_is_a_retried_502(reply: bytes) -> None:
    """A head the gateway cannot relay: 502 after three attempts (each on a new connection),
    then the next request on the same client connection is served."""
    with fresh(bad=reply, after=ok(b"after")) as pair:
        obs = pair.same(then_after(get(b"/bad")))
        assert status(obs) == b"HTTP/1.1 502 Bad Gateway"
        assert obs.responses[0][1].endswith(b"after")
        assert paths(obs).count(b"GET /bad HTTP/1.1") == 3
        assert obs.metrics["ballast_upstream_errors_total{kind=protocol}"] == 3


def test_a_length_that_lies_short_then_the_next_request() -> None:
    """10 bytes promised, 20 sent: the client gets 10; the next request goes on a new
    upstream connection (the extra bytes spoil the old one)."""
    lie = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n" + b"y" * 20
    with fresh(bad=lie, after=ok(b"after")) as pair:
        obs = pair.same(then_after(get(b"/bad")))
        assert obs.responses[0][0].endswith(b"\r\n\r\n" + b"y" * 10)
        assert [conn for conn, _ in obs.upstream[:2]] == ["pooled", "new"]


def test_a_length_that_lies_long_then_the_deadline() -> None:
    """100 bytes promised, 20 sent, then nothing: the deadline (300 ms) ends it the same way."""
    lie = Hold(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"y" * 20)
    with fresh(long=lie) as pair:
        obs = pair.same(one(get(b"/long", b"X-Deadline-Ms: 300\r\n")))
        assert obs.responses[0][0].endswith(b"y" * 20 + b"<eof>") and obs.endings == ["closed"]


def test_garbage_after_a_complete_upstream_response() -> None:
    """Bytes after a complete response: the client gets the response; the next request too,
    on a new upstream connection."""
    with fresh(garbage=ok(b"fine") + b"GARBAGE\r\n\r\n", after=ok(b"after")) as pair:
        obs = pair.same(then_after(get(b"/garbage")))
        assert obs.responses[0][0].endswith(b"fine") and obs.responses[0][1].endswith(b"after")
        assert [conn for conn, _ in obs.upstream[:2]] == ["pooled", "new"]


def test_a_pooled_connection_closed_without_an_answer_is_retried() -> None:
    """The upstream closes the pooled connection on reading the request (a keep-alive race):
    the same retry on a new connection, the same answer."""
    with fresh(stale=(Close(b""), ok(b"fresh"))) as pair:
        obs = pair.same(one(get(b"/stale")))
        assert obs.responses[0][0].endswith(b"fresh")
        assert [conn for conn, _ in obs.upstream[:2]] == ["pooled", "new"]


@pytest.mark.parametrize(
    "reply",
    [
        Close(ok(b"bye", extra=b"Connection: close\r\n")),
        Close(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nread to the close"),
        b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after an interim response"),
    ],
    ids=["connection-close", "http-1.0-no-length", "interim-100"],
)
def test_upstream_framing_variants_then_the_next_request(reply: Reply) -> None:
    """An upstream that closes after its answer, answers HTTP/1.0 to the close, or sends a 100
    first: the same answer and the same next request."""
    with fresh(var=reply, after=ok(b"after")) as pair:
        obs = pair.same(then_after(get(b"/var")))
        assert obs.responses[0][1].endswith(b"after")


def test_an_8_mib_response_streams_past_the_retry_buffer(shared: Pair) -> None:
    """8 MiB (over retry.max_buffer_bytes, so streamed): every byte, in order."""
    shared.upstream.program("/big", ok(MIB * 8))
    obs = shared.same(one(get(b"/big")))
    assert obs.responses[0][0].endswith(MIB * 8) and obs.endings == ["open"]


def test_a_post_between_gets_on_one_connection(shared: Pair) -> None:
    """GET, POST with a body (the ASGI path on both arms), GET: in order, the body upstream."""
    shared.upstream.program("/g", ok(b"g"))
    post = b"POST /g HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello"

    def script(arm: Arm) -> list[Client]:
        c = arm.client()
        for data in (get(b"/g"), post, get(b"/g")):
            c.send(data)
            c.response()
        return [c]

    obs = shared.same(script)
    assert paths(obs)[:3] == [b"GET /g HTTP/1.1", b"POST /g HTTP/1.1", b"GET /g HTTP/1.1"]


@pytest.mark.parametrize(
    "request_bytes",
    [
        get(b"/a%20b/c?x=1&y=%2F&z"),
        get(b"/%7Euser/a%2Fb;p=1?"),
        get(b"//double//slash"),
        get(b"/utf8/\xc3\xbc?q=\xc3\xa4"),
        get(b"http://t/absolute?form=1"),
        b"GET /nohost HTTP/1.1\r\n\r\n",
        get(b"/dup", b"X-A: 1\r\nx-a: 2\r\nCookie: a=1\r\nCookie: b=2\r\n"),
        get(b"/hop", b"Connection: keep-alive, X-Drop\r\nX-Drop: 1\r\nKeep-Alive: timeout=5\r\n"),
        get(b"/hop2", b"TE: trailers\r\nProxy-Authorization: Basic eA==\r\nTrailer: X-T\r\n"),
        get(b"/case", b"X-MiXeD-CaSe: VaLuE\r\nx-empty:\r\nX-Spaces:   padded   \r\n"),
        get(b"/long", b"X-Long: " + b"v" * 8000 + b"\r\n"),
        get(b"/many", b"".join(b"X-H%d: %d\r\n" % (i, i) for i in range(60))),
        get(b"/budget", b"X-Deadline-Ms: 5000\r\n"),
        get(b"/budget-bad", b"X-Deadline-Ms: soon\r\n"),
        get(b"/tier", b"X-Priority: bulk\r\n"),
        get(b"/tier-bad", b"X-Priority: urgent!\r\n"),
        get(b"/expect", b"Expect: 100-continue\r\n"),
        get(b"/cl0", b"Content-Length: 0\r\n"),
        get(b"/obs", b"X-Obs: caf\xe9\r\n"),
        get(b"/opt", method=b"OPTIONS"),
        get(b"/del", method=b"DELETE"),
        get(b"/up", b"Upgrade: h2c\r\n"),
        get(b"/auth", b"Authorization: Bearer t\r\nX-Forwarded-Proto: https\r\n"),
        get(b"/xfh", b"X-Forwarded-Host: evil\r\nForwarded: for=1.2.3.4\r\n"),
    ],
    ids=lambda b: b.split(b" ")[1][:24].decode("latin-1"),
)
def test_request_targets_and_headers_reach_the_upstream_the_same(
    shared: Pair, request_bytes: bytes
) -> None:
    """Encoded and odd targets, duplicate, hop-by-hop, odd-cased, long and many headers, a
    budget, tiers, methods without a body: the same head upstream, the same answer."""
    obs = shared.same(one(request_bytes))
    assert obs.endings in (["open"], ["closed"]) and len(obs.responses[0]) >= 1


@pytest.mark.parametrize(
    "reply",
    [
        ok(b"x", b"200 Very OK"),
        ok(b"x", b"599 Whatever"),
        ok(b"x", b"299 Unknown Success"),
        ok(b"x", b"200 OK", b"Set-Cookie: a=1\r\nSet-Cookie: b=2\r\nSERVER: up\r\nDate: x\r\n"),
        ok(b"x", b"200 OK", b"Connection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: t=5\r\n"),
        ok(b"x", b"200 OK", b"X-Obs: caf\xe9\r\nX-Empty:\r\nX-Tab: a\tb\r\n"),
        ok(b"", b"200 OK"),
        ok(b"x", b"200 OK", b"Content-Length: 1\r\n"),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n"
        b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"1\r\nz\r\n" * 200
        + b"0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Length:  2 \r\n\r\nok",
        ok(b"x", b"201 Created", b"Location: /made\r\nContent-Location: http://elsewhere/x\r\n"),
        ok(b"x", b"200 OK", b"X-Location: http://127.0.0.1/x\r\n"),
    ],
    ids=[
        "reason-phrase",
        "status-599",
        "status-299",
        "set-cookie-server-date",
        "hop-by-hop",
        "obs-text-empty-tab",
        "empty-body",
        "duplicate-length",
        "trailers",
        "chunk-extension",
        "200-one-byte-chunks",
        "http-1.0-with-length",
        "length-with-spaces",
        "location-relative",
        "not-a-location",
    ],
)
def test_response_head_variants_reach_the_client_the_same(shared: Pair, reply: bytes) -> None:
    """Reason phrases, unknown statuses, repeated and hop-by-hop fields, obs-text, trailers,
    chunk extensions, HTTP/1.0 upstreams: the same bytes to the client on both arms."""
    path = "/rv-" + hashlib.sha1(reply).hexdigest()[:8]
    shared.upstream.program(path, reply)
    obs = shared.same(then_after(get(path.encode())))
    assert obs.responses[0][1].startswith(b"HTTP/1.1 200")


def test_a_shed_then_a_proxied_get_pipelined(shared: Pair) -> None:
    """A request shed at the wire (spent deadline) and a proxied GET in one write: both
    answered in order, the proxied one upstream once."""
    shared.upstream.program("/after-shed", ok(b"served"))

    def script(arm: Arm) -> list[Client]:
        c = arm.client()
        c.send(get(b"/x", b"X-Deadline-Ms: 0\r\n") + get(b"/after-shed"))
        c.response()
        c.response()
        return [c]

    obs = shared.same(script)
    assert status(obs).startswith(b"HTTP/1.1 429") and obs.responses[0][1].endswith(b"served")


def test_a_client_that_leaves_mid_body() -> None:
    """8 MiB (streamed): the client reads the head and leaves; the upstream connection is not
    pooled again and the counts are the same."""
    with fresh(big=ok(MIB * 8)) as pair:

        def script(arm: Arm) -> list[Client]:
            c = arm.client()
            c.send(get(b"/big"))
            while b"\r\n\r\n" not in c._buf and c._fill():
                pass
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            c.close()  # RST: unread data dropped
            let_go = arm.wait_upstream(lambda u: bool(u.closed_by_gateway))
            arm.notes.append(f"upstream connection closed by the gateway: {let_go}")
            return []

        obs = pair.same(script)
        assert obs.notes == ["upstream connection closed by the gateway: True"]


def test_two_clients_at_once_with_one_pooled_connection(shared: Pair) -> None:
    """While one request holds the only pooled upstream connection, a second client's GET
    opens a new one; both answered, the same upstream traffic on both arms."""
    shared.upstream.program("/gated", Gated("two-clients", ok(b"first")))
    shared.upstream.program("/second", ok(b"second"))

    def script(arm: Arm) -> list[Client]:
        a, b = arm.client(), arm.client()
        a.send(get(b"/gated"))
        arm.notes.append(f"held: {arm.wait_upstream(lambda u: bool(u.received))}")
        b.send(get(b"/second"))
        b.response()
        arm.upstream.release("two-clients")
        a.response()
        return [a, b]

    obs = shared.same(script)
    assert obs.responses[0][0].endswith(b"first") and obs.responses[1][0].endswith(b"second")
    assert [conn for conn, _ in obs.upstream[:2]] == ["pooled", "new"]


@pytest.mark.parametrize(
    "parts",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Le", b"ngth: 5\r\n\r", b"\nhel", b"lo"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"h", b"e", b"l", b"l", b"o"),
    ],
    ids=["split-head", "byte-body"],
)
def test_a_response_in_pieces(shared: Pair, parts: tuple[bytes, ...]) -> None:
    """A response head or body split across writes: the same bytes reach the client (a
    chunked body split so is not here: the relay's chunks follow its reads, which timing
    decides on either arm)."""
    path = "/pieces-" + hashlib.sha1(b"".join(parts)).hexdigest()[:8]
    shared.upstream.program(path, Pieces(parts))
    obs = shared.same(then_after(get(path.encode())))
    assert obs.responses[0][0].endswith(b"\r\n\r\nhello")


def test_a_request_head_sent_byte_by_byte(shared: Pair) -> None:
    """A request head that arrives one byte per write: decided once complete, the same."""
    shared.upstream.program("/slowhead", ok(b"slow head"))
    data = get(b"/slowhead", b"X-Priority: critical\r\n")

    def script(arm: Arm) -> list[Client]:
        c = arm.client()
        c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(data)):
            c.send(data[i : i + 1])
        c.response()
        return [c]

    obs = shared.same(script)
    assert obs.responses[0][0].endswith(b"slow head")


def test_a_request_queued_behind_one_in_the_lane_is_served_when_it_ends() -> None:
    """A fixed limit of 1: B waits in the admission queue while A holds the permit; when A's
    answer comes, B is admitted and served. The same counts (queued, waits) on both arms."""
    overrides = {"limiter": {"algorithm": "fixed", "fixed_limit": 1}}
    with fresh(overrides, gated=Gated("queue", ok(b"first")), second=ok(b"second")) as pair:

        def script(arm: Arm) -> list[Client]:
            a, b = arm.client(), arm.client()
            a.send(get(b"/gated"))
            arm.notes.append(f"held: {arm.wait_upstream(lambda u: bool(u.received))}")
            b.send(get(b"/second"))
            queued = arm.gateway.parts.queue
            arm.notes.append(f"queued: {wait_until(lambda: queued.total == 1)}")
            arm.upstream.release("queue")
            a.response()
            b.response()
            return [a, b]

        obs = pair.same(script)
        assert obs.responses[0][0].endswith(b"first") and obs.responses[1][0].endswith(b"second")
        assert obs.notes == ["held: True", "queued: True"]


def test_fifty_pipelined_gets_read_only_at_the_end(shared: Pair) -> None:
    """50 GETs of 60 KB in one write, read only once all are sent: every answer, in order
    (the server's write backpressure and pipelining, the same on both arms)."""
    body = bytes(range(256)) * 240
    shared.upstream.program("/p60k", ok(body))

    def script(arm: Arm) -> list[Client]:
        c = arm.client()
        c.send(get(b"/p60k") * 50)
        for _ in range(50):
            c.response()
        return [c]

    obs = shared.same(script)
    assert all(r.endswith(body) for r in obs.responses[0][:50])


def test_failures_from_three_clients_open_the_breaker_the_same_way() -> None:
    """500s to three clients (127.0.0.2-4) in turn open the route's breaker after ten in a
    row; the next request is refused the same way. Breaker transitions and sheds counted
    the same on both arms."""
    with fresh(e500=ok(b"boom", b"500 Internal Server Error")) as pair:

        def script(arm: Arm) -> list[Client]:
            clients = [arm.client(f"127.0.0.{n}") for n in (2, 3, 4)]
            for i in range(12):
                c = clients[i % 3]
                c.send(get(b"/e500"))
                c.response()
            return clients

        obs = pair.same(script)
        assert obs.metrics.get("ballast_breaker_transitions_total{to=open}") == 1
        answers = [r for conn in obs.responses for r in conn]
        assert any(b"x-ballast-reason: breaker_open" in r for r in answers)


def test_the_lane_arm_serves_the_common_get_without_an_asgi_call(shared: Pair) -> None:
    """The suite compares the real lane: with ``server.lane`` five 1 KB GETs and the probe
    reach no ASGI app call (the lane served them); without it each of the six does."""
    shared.upstream.program("/engaged", ok(KB))

    def script(arm: Arm) -> list[Client]:
        c = arm.client()
        for _ in range(5):
            c.send(get(b"/engaged"))
            c.response()
        return [c]

    obs = shared.same(script)
    assert (obs.extra["asgi_calls"], obs.extra["lane_asgi_calls"]) == (6, 0)


@pytest.mark.parametrize(
    "size", [0, 1, 4095, 4096, 16384, 65535, 65536, 65537, 131072, 262144, 1048577]
)
def test_body_sizes_around_buffer_boundaries(shared: Pair, size: int) -> None:
    """Bodies around the read, join and high-water sizes: every byte, then the next request."""
    body = (bytes(range(256)) * (size // 256 + 1))[:size]
    path = f"/size-{size}"
    shared.upstream.program(path, ok(body))
    obs = shared.same(then_after(get(path.encode())))
    assert obs.responses[0][0].endswith(b"\r\n\r\n" + body)


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" + ok(b"after hints"),
        ok(b"says close", extra=b"Connection: close\r\n"),
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-F%d: v\r\n" % i for i in range(97)) + ok(b"")[17:],
    ],
    ids=["unasked-101", "early-hints-103", "close-but-open", "99-fields"],
)
def test_more_upstream_heads_then_the_next_request(reply: bytes) -> None:
    """An unasked 101, a 103 before the answer, a Connection: close on a connection left open,
    99 header fields: the same answer and the same next request on both arms."""
    with fresh(odd=reply, after=ok(b"after")) as pair:
        obs = pair.same(then_after(get(b"/odd")))
        assert obs.responses[0][1].endswith(b"after")


def test_an_idle_connection_is_closed_after_the_keep_alive_time() -> None:
    """server.keep_alive_ms 300: after a served GET the idle connection is closed by the
    server on both arms (the lane arms uvicorn's keep-alive timer too); read to the close."""
    with lane_pair(server={"keep_alive_ms": 300}) as pair:
        pair.upstream.program("/idle", ok(b"idle"))

        def script(arm: Arm) -> list[Client]:
            c = arm.client()
            c.send(get(b"/idle"))
            c.response()
            rest = c.until_close()
            arm.notes.append(f"closed by the server: {c.transcript[-1:] != [b'<timeout>']}")
            arm.notes.append(f"then: {rest!r}")
            c.close()
            return []

        obs = pair.same(script)
        assert obs.notes == ["closed by the server: True", "then: b''"]


def test_a_client_that_half_closes_after_its_request() -> None:
    """A client that shuts its write side once the upstream has its GET: the server closes the
    connection (uvicorn closes on EOF) and the answer that comes later is dropped, the same
    way and with the same counts on both arms (the gate keeps the order fixed)."""
    with fresh(half=Gated("half", ok(b"half"))) as pair:

        def script(arm: Arm) -> list[Client]:
            c = arm.client()
            c.send(get(b"/half"))
            arm.notes.append(f"upstream got it: {arm.wait_upstream(lambda u: bool(u.received))}")
            c.sock.shutdown(socket.SHUT_WR)
            c.transcript.append(c.until_close())
            arm.upstream.release("half")
            return [c]

        obs = pair.same(script)
        assert obs.responses == [[b""]] and obs.endings == ["closed"]


def test_http_1_0_with_keep_alive(shared: Pair) -> None:
    """HTTP/1.0 asking for keep-alive: answered the same way, the connection the same."""
    shared.upstream.program("/ten-ka", ok(b"ten"))
    obs = shared.same(one(get(b"/ten-ka", b"Connection: keep-alive\r\n", version=b"1.0")))
    assert obs.responses[0][0].endswith(b"ten")
