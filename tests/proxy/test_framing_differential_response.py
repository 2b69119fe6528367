"""Differential framing test, response half: hostile upstream answers through every transport.

hypothesis builds upstream answers (interim 1xx, odd statuses, Content-Length
right, short, long, negative, huge, repeated or listed, chunked with odd chunk
sizes or truncated, other transfer codings, CL with TE, many or huge fields,
``Connection`` naming framing headers, bare-LF heads, a smuggled second response
after the first) and a raw-socket upstream sends each to a real uvicorn gateway.
A client writes ``GET /h/<key>`` and ``GET /second`` in one write on one
connection and parses the answers with h11. For every answer:

* one response comes back for the first request: the upstream's own (its status
  and its body bytes as RFC 9112 frames them) or the gateway's 502, or the
  connection is cut before that response is complete (an abort); never two;
* when the answer is exactly framable (statuses 200-599, known framing, CRLF)
  it is relayed exactly; when a rule of docs/security.md "Upstream responses"
  refuses it, it is a 502; when its body is cut or malformed, a 502 or an abort;
* when the connection survives, the pipelined ``/second`` gets ``good``: the
  keep-alive connection is never desynchronised, and no smuggled bytes from a
  pooled upstream connection are ever taken for an answer.

The request half (client side, request writing) lives in its own module.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ballast_asgi.config import ProxyConfig
from ballast_asgi.proxy.app import ProxyApp
from tests.e2e.hostile_response import GOOD, GOOD_BODY, Exchange, HostileUpstream, pipelined
from tests.e2e.support import thread_servers

pytestmark = pytest.mark.e2e

TRANSPORTS = ("lean", "aiohttp", "httpx")
#: Examples per transport: the module runs in about 10-20 s on the 2-core reference machine.
EXAMPLES = 200

#: Framings: how the body is delimited (and how that lies).
EXACT = ("cl", "cl-short", "chunked", "none")
REFUSED = ("cl-neg", "cl-plus", "cl-dup-diff", "te-chunked-gzip", "te-gzip", "te-identity",
           "te-twice", "cl-te", "te-gzip-chunked")  # fmt: skip
#: Refused by our rule, or read as one value by a parser that merges equal lengths (h11).
MERGED = ("cl-dup-same", "cl-list")
BROKEN = ("cl-long", "cl-huge", "chunked-truncated", "chunked-bad-size")
FRAMINGS = EXACT + REFUSED + MERGED + BROKEN
#: Chunk-size spellings a parser must accept (RFC 9112 7.1: hex, any case, extensions).
GOOD_SIZES = ("hex", "upper", "zeros", "ext")
BAD_SIZES = ("overflow", "negative", "0x", "empty", "space-inside")
SMUGGLED = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil"
TOKEN = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map(str.encode)
VALUE = st.binary(max_size=20).map(
    lambda b: bytes(c for c in b if 0x20 < c < 0x7F) or b"v"  # visible ASCII, never empty
) | st.sampled_from([b"a\x01b", b"a\x7fb", b"a\x1bb", b"\x0bv", b"a\x0cb", b"a\tb", b"caf\xe9"])
#: Control characters no field value may hold (HTAB may): uvicorn raises on them.
CTL = frozenset([*range(0, 9), *range(10, 32), 127])
NO_CONTENT = (204, 304)


@dataclass
class Answer:
    """One upstream answer as generated, with what the client may see for it."""

    interim: list[int]
    status: int
    framing: str
    body: bytes
    cuts: list[int]
    size_form: str
    extra: list[tuple[bytes, bytes]]
    many: int
    big: bool
    connection: bytes | None
    bare_lf: bool
    smuggle: bool
    #: A head oddity: obs-fold, a leading space, no reason phrase, HTTP/1.0 (or None).
    quirk: str | None = None
    wire: bytes = b""
    keep: bool = True
    fields: int = 0
    #: The Content-Length an RFC 9112 reader takes (one value) and the bytes after the head.
    length: int = -1
    rest: bytes = b""

    # -- the bytes ---------------------------------------------------------------
    def build(self) -> Answer:
        """Fill ``wire`` (the bytes the upstream sends) and ``keep`` (connection kept)."""
        body, n = self.body, len(self.body)
        payload = body
        fields: list[tuple[bytes, bytes]] = []
        framing = self.framing
        if framing in ("cl", "cl-short", "cl-long"):
            delta = {"cl": 0, "cl-short": -min(n, 1 + n // 3), "cl-long": 1 + n // 2}[framing]
            fields.append((b"Content-Length", b"%d" % (n + delta)))
            self.length = n + delta
        elif framing == "cl-neg":
            fields.append((b"Content-Length", b"-%d" % n))
        elif framing == "cl-plus":
            fields.append((b"Content-Length", b"+%d" % n))
        elif framing == "cl-huge":
            fields.append((b"Content-Length", b"9" * 25))
        elif framing == "cl-dup-same":
            fields += [(b"Content-Length", b"%d" % n)] * 2
        elif framing == "cl-dup-diff":
            fields += [(b"Content-Length", b"%d" % n), (b"Content-Length", b"%d" % (n + 1))]
        elif framing == "cl-list":
            fields.append((b"Content-Length", b"%d, %d" % (n, n)))
        chunked = framing.startswith(("chunked", "te-", "cl-te"))
        if framing.startswith("chunked") or framing in ("te-twice", "cl-te", "te-gzip-chunked"):
            payload = self._chunked(truncated=framing == "chunked-truncated")
        if chunked:
            codings = {
                "te-chunked-gzip": [b"chunked, gzip"],
                "te-gzip": [b"gzip"],
                "te-identity": [b"identity"],
                "te-twice": [b"chunked", b"chunked"],
                "te-gzip-chunked": [b"gzip, chunked"],
            }.get(framing, [b"chunked"])
            fields += [(b"Transfer-Encoding", c) for c in codings]
            if framing == "cl-te":
                fields.append((b"Content-Length", b"%d" % n))
        fields += self.extra
        fields += [(b"X-Many-%d" % i, b"v") for i in range(self.many)]
        if self.big:
            fields += [(b"X-Big-A", b"a" * 40_000), (b"X-Big-B", b"b" * 30_000)]
        # keep the upstream connection only when every reading finds the answer complete;
        # else close it (the body ends there), saying so, as a server does: a silent close
        # would race the gateway's reuse of a connection it read an answer from
        complete = framing in ("cl", "cl-short", "cl-dup-same", "cl-list", "te-twice", "cl-te",
                               "te-gzip-chunked") or (framing == "chunked"
                                                      and self.size_form in GOOD_SIZES)  # fmt: skip
        self.keep = (complete or self.status in NO_CONTENT) and self.connection != b"close"
        self.keep = self.keep and self.quirk != "http10"  # HTTP/1.0: closed after it
        connection = self.connection
        if not self.keep and connection not in (None, b"close", b"keep-alive"):
            connection = b"close, " + connection  # ("close, keep-alive" is for aiohttp keep)
        elif not self.keep:
            connection = b"close"
        if connection is not None:
            fields.append((b"Connection", connection))
        self.fields = len(fields)
        eol = b"\n" if self.bare_lf else b"\r\n"
        heads = [b"HTTP/1.1 %03d Odd\r\n\r\n" % code for code in self.interim]
        version, reason = b"HTTP/1.0" if self.quirk == "http10" else b"HTTP/1.1", b" Status"
        lines = [version + b" %03d" % self.status + (b"" if self.quirk == "no-reason" else reason)]
        lines += [k + b": " + v for k, v in fields]
        if self.quirk == "fold":  # obs-fold: a continuation line (RFC 9112 5.2)
            lines.insert(1, b"X-Folded: a")
            lines.insert(2, b" b")
        elif self.quirk == "space":  # whitespace before the first field line
            lines.insert(1, b" X-Space: v")
        head = eol.join(lines) + eol + eol
        self.rest = payload + (SMUGGLED if self.smuggle else b"")
        self.wire = b"".join(heads) + head + self.rest
        if framing in ("cl-dup-same", "cl-list"):
            self.length = n
        return self

    def _chunked(self, truncated: bool) -> bytes:
        pieces = [
            self.body[a:b]
            for a, b in zip([0, *self.cuts], [*self.cuts, len(self.body)], strict=True)
        ]
        out = b""
        for i, piece in enumerate(p for p in pieces if p):
            out += self._size(len(piece), first=i == 0) + b"\r\n" + piece + b"\r\n"
        return out if truncated else out + b"0\r\n\r\n"

    def _size(self, size: int, first: bool) -> bytes:
        form = self.size_form if first else "hex"
        return {
            "hex": b"%x" % size,
            "upper": b"%X" % size,
            "zeros": b"000%x" % size,
            "ext": b"%x;name=value" % size,
            "overflow": b"1" + b"0" * 17 + b"%x" % size,
            "negative": b"-%x" % size,
            "0x": b"0x%x" % size,
            "empty": b"",
            "space-inside": b"%x %x" % (size, size),
        }[form]

    # -- the oracle -------------------------------------------------------------
    def refused(self) -> bool:
        """A rule of docs/security.md "Upstream responses" refuses this head (502)."""
        return (
            not 200 <= self.status <= 599
            or 101 in self.interim
            or self.framing in REFUSED
            or self.fields > 100
            or self.big
            or any(CTL.intersection(value) for _, value in self.extra)
        )

    def clean(self) -> bool:
        """Exactly framable, CRLF, nothing after it: must be relayed (checked by ``relayed``).

        Bytes after a complete answer (a smuggled response, a 204's "body") may cost
        that answer a 502 (aiohttp parses them at once and fails the exchange)."""
        return (
            self.framing in ("cl", "chunked", "none")
            and self.relayed() is not None
            and not self.bare_lf
            and self.quirk not in ("fold", "space")
            and not (self.smuggle and self.framing != "none")
            and not (self.status in NO_CONTENT and self.rest)  # bytes after a 204/304
        )

    def relayed(self) -> tuple[int, bytes] | None:
        """The (status, body) a client must get when the answer is relayed, RFC 9112 reading."""
        if self.status in NO_CONTENT:
            return self.status, b""
        if self.length >= 0:  # the first ``length`` bytes after the head, if they came
            return (
                (self.status, self.rest[: self.length]) if len(self.rest) >= self.length else None
            )
        if self.framing == "chunked" and self.size_form in GOOD_SIZES:
            return self.status, self.body
        if self.framing == "none":  # close-delimited: everything until the upstream closes
            return self.status, self.rest
        return None  # broken framing: no complete response may come out


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    """One hostile (or clean) upstream answer."""
    body = draw(st.binary(max_size=40) | st.sampled_from([b"", b"0\r\n\r\n", SMUGGLED]))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(body) - 1)), max_size=3))))
    cuts = [c for c in cuts if 0 < c < len(body)]
    odd = st.sampled_from([0, 99, 600, 999, 1000])
    status = draw(st.sampled_from([200, 201, 204, 206, 301, 304, 404, 500, 503, 599]) | odd)
    framing = draw(st.sampled_from(FRAMINGS))
    size_form = draw(st.sampled_from(GOOD_SIZES + BAD_SIZES))
    if framing == "chunked-bad-size":
        framing, size_form = "chunked", draw(st.sampled_from(BAD_SIZES))
    if not body and framing == "chunked" and size_form in BAD_SIZES:
        body = b"x"  # a bad size needs a chunk to be spelled on
    return Answer(
        interim=draw(st.lists(st.sampled_from([100, 102, 103, 150, 101]), max_size=2)),
        status=status,
        framing=framing,
        body=body,
        cuts=cuts,
        size_form=size_form,
        extra=draw(st.lists(st.tuples(TOKEN.map(lambda t: b"X-" + t), VALUE), max_size=3)),
        many=draw(st.sampled_from([0, 0, 0, 0, 20, 90, 120])),  # 90 + the rest stays <= 100
        big=draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans()),
        connection=draw(
            st.sampled_from(
                [
                    None,
                    None,
                    b"close",
                    b"keep-alive",
                    b"content-length",
                    b"transfer-encoding",
                    b"X-Anything",
                ]
            )
        ),
        bare_lf=draw(st.booleans()) and draw(st.booleans()),
        quirk=draw(st.sampled_from([None, None, None, "fold", "space", "no-reason", "http10"])),
        smuggle=draw(st.booleans()),
    ).build()


@pytest.fixture(scope="module")
def gateways() -> Iterator[tuple[HostileUpstream, dict[str, int]]]:
    """The hostile upstream and one uvicorn gateway per transport."""
    up = HostileUpstream().start()
    with thread_servers() as start:
        ports = {}
        for transport in TRANSPORTS:
            config = ProxyConfig.model_validate({"transport": transport, "timeout_ms": 5_000})
            ports[transport] = start(ProxyApp(f"http://127.0.0.1:{up.port}", config=config))
        yield up, ports
    up.stop()


def _is_502(exchange: Exchange) -> bool:
    first = exchange.first
    return first.complete and first.status == 502 and b"bad_gateway" in first.body


def check(answer: Answer, exchange: Exchange) -> None:
    """One response or an abort per request; exact when framable; the connection in sync."""
    why = f"{answer.wire[:300]!r} -> {exchange}"
    assert not exchange.malformed, why  # never bytes a client cannot parse as responses
    first = exchange.first
    if answer.refused():
        assert _is_502(exchange), why
    elif first.complete and not _is_502(exchange):
        expected = answer.relayed()
        assert expected is not None, why  # a broken body never comes out as complete
        assert (first.status, first.body) == expected, why
    elif answer.clean():
        # exactly framable, CRLF, nothing after it (aiohttp refuses bytes after a response
        # that said ``Connection: close``): relayed, never refused or cut
        assert first.complete and not _is_502(exchange), why
    if exchange.second is not None:
        assert exchange.second.complete, why
        assert (exchange.second.status, exchange.second.body) == (200, GOOD_BODY), why
    else:
        assert exchange.cut, why  # no second answer only when the connection was closed


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_one_answer_in_one_response_or_an_abort_out(
    gateways: tuple[HostileUpstream, dict[str, int]], transport: str
) -> None:
    """Every generated upstream answer: one response (exact or 502) or an abort, in sync."""
    up, ports = gateways

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(answer=answers())
    def run(answer: Answer) -> None:
        path = up.answer(uuid.uuid4().hex, answer.wire, close=not answer.keep)
        check(answer, pipelined(ports[transport], path))

    run()


def test_the_oracle_knows_a_clean_answer() -> None:
    """The harness itself: a clean answer builds the bytes a server would send, kept alive."""
    clean = Answer([], 200, "cl", b"ok", [], "hex", [], 0, False, None, False, False).build()
    assert clean.wire == b"HTTP/1.1 200 Status\r\nContent-Length: 2\r\n\r\nok"
    assert clean.keep and not clean.refused() and clean.relayed() == (200, b"ok")
    assert GOOD.endswith(GOOD_BODY)
