"""Issue 27: the request head is the one source of framing; the proxy writes its own.

Pure ``read_head`` rules, the Connection-token rules of ``request_headers``, and
the proxy (alone and behind the stack) against a recording ``MockTransport``.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client import generate_latest

from ballast_asgi.config import ProxyConfig, build_config
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.head import HeadLimits, read_head
from ballast_asgi.core.types import Message
from ballast_asgi.gateway import build_gateway
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.headers import PROTECTED, request_headers

pytestmark = pytest.mark.anyio

H = list[tuple[bytes, bytes]]
_LIMITS = HeadLimits()


def _refused(headers: H, method: str = "POST", limits: HeadLimits = _LIMITS) -> int:
    with pytest.raises(HeaderError) as exc:
        read_head(headers, limits, method)
    return exc.value.status


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([(b"content-length", b"5"), (b"transfer-encoding", b"chunked")], 400),
        ([(b"transfer-encoding", b"chunked"), (b"content-length", b"0")], 400),
        ([(b"transfer-encoding", b"gzip, chunked")], 501),
        ([(b"transfer-encoding", b"chunked, chunked")], 501),
        ([(b"transfer-encoding", b"chunked"), (b"transfer-encoding", b"chunked")], 501),
        ([(b"transfer-encoding", b"identity")], 501),
        ([(b"transfer-encoding", b"xchunked")], 501),
        ([(b"content-length", b"5, 5")], 400),
        ([(b"content-length", b"-1")], 400),
        ([(b"content-length", b"+5")], 400),
        ([(b"content-length", b"0x10")], 400),
        ([(b"content-length", b"5"), (b"content-length", b"6")], 400),
        ([(b"host", b"a"), (b"host", b"a")], 400),
        ([(b"host", b"a"), (b"host", b"evil")], 400),
    ],
)
def test_ambiguous_framing_and_duplicate_host_are_refused(headers: H, status: int) -> None:
    """CL with TE, codings other than one chunked, odd lengths and two Hosts are refused."""
    assert _refused(headers) == status


def test_a_content_length_of_thousands_of_digits_is_refused_not_a_crash() -> None:
    """A 5,000-digit length (past int()'s digit limit) is 413 with a limit, 400 without."""
    huge = [(b"content-length", b"9" * 5000)]
    assert _refused(huge, limits=HeadLimits(max_body_bytes=1 << 20)) == 413
    assert _refused(huge) == 400
    assert read_head([(b"content-length", b"0" * 5000 + b"7")], HeadLimits()).content_length == 7


def test_connect_and_a_protocol_switch_with_a_body_are_refused() -> None:
    """CONNECT is 405; Connection: upgrade + Upgrade with a body is 400; without one it is kept."""
    assert _refused([], method="CONNECT") == 405
    upgrade: H = [(b"connection", b"keep-alive, Upgrade"), (b"upgrade", b"foo")]
    assert _refused([*upgrade, (b"content-length", b"5")]) == 400
    assert _refused([*upgrade, (b"transfer-encoding", b"chunked")]) == 400
    head = read_head([*upgrade, (b"content-length", b"0")], HeadLimits(), "GET")
    assert head.upgrade and not head.has_body
    assert not read_head([(b"upgrade", b"foo")], HeadLimits()).upgrade  # not asked by Connection
    assert read_head([(b"transfer-encoding", b" Chunked ")], HeadLimits()).chunked


def _scope(headers: H, method: str = "POST") -> dict[str, Any]:
    return {
        "type": "http", "http_version": "1.1", "method": method, "scheme": "http",
        "path": "/p", "raw_path": b"/p", "query_string": b"", "root_path": "",
        "headers": headers, "client": ("10.0.0.1", 5000), "server": ("127.0.0.1", 8080),
    }  # fmt: skip


def test_connection_tokens_cannot_remove_protected_headers() -> None:
    """Tokens naming framing, Host or the gateway's own headers are ignored; others still work."""
    named = b", ".join(sorted(PROTECTED)) + b", x-secret"
    headers: H = [
        (b"host", b"gw"),
        (b"connection", named),
        (b"content-length", b"5"),
        (b"x-priority", b"bulk"),
        (b"x-secret", b"s"),
    ]
    out = dict(request_headers(_scope(headers), drop_deadline=False))
    assert b"content-length" not in out and b"transfer-encoding" not in out  # the proxy's own
    assert out[b"x-priority"] == b"bulk" and out[b"x-forwarded-host"] == b"gw"
    assert b"x-forwarded-for" in out and b"x-secret" not in out


@pytest.mark.parametrize("value", [b"keep-alive", b"Keep-Alive", b"close", b"X-Secret", b"te"])
def test_a_single_connection_token_on_a_request_removes_only_what_it_names(value: bytes) -> None:
    """One token (the common ``keep-alive`` takes a shortcut) acts as it does in a list."""
    rest: H = [(b"close", b"c"), (b"x-secret", b"s"), (b"keep-alive", b"5"), (b"te", b"t")]
    alone = request_headers(_scope([(b"connection", value), *rest]), drop_deadline=False)
    listed = [(b"connection", value + b", x-unused"), *rest]
    assert alone == request_headers(_scope(listed), drop_deadline=False)
    names = {name for name, _ in alone} - {b"x-forwarded-for", b"x-forwarded-proto"}
    assert names == {b"close", b"x-secret"} - {value.lower()}


class Recorder:
    """MockTransport handler: records requests (body read) and answers 200."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        self.requests.append(request)
        return httpx.Response(200, content=b"ok")


async def _call(app: Any, scope: dict[str, Any], chunks: list[bytes]) -> list[Message]:
    incoming: list[Message] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def _proxy(up: Recorder, buffer_bytes: int = 1 << 20) -> ProxyApp:
    config = ProxyConfig.model_validate({"request_buffer_bytes": buffer_bytes})
    return ProxyApp("http://up.test", config=config, transport=httpx.MockTransport(up))


@pytest.mark.parametrize("buffer_bytes", [1 << 20, 4])
async def test_the_proxy_frames_the_body_it_forwards_whatever_connection_names(
    buffer_bytes: int,
) -> None:
    """``Connection: content-length`` (read or streamed body): the upstream gets its length."""
    up = Recorder()
    headers: H = [(b"host", b"gw"), (b"connection", b"content-length"), (b"content-length", b"10")]
    sent = await _call(_proxy(up, buffer_bytes), _scope(headers), [b"01234", b"56789"])
    assert sent[0]["status"] == 200
    (request,) = up.requests
    assert request.headers.get_list("content-length") == ["10"]
    assert request.content == b"0123456789"


@pytest.mark.parametrize("buffer_bytes", [1 << 20, 4])
@pytest.mark.parametrize("chunks", [[b""], [b"0123"], [b"0123456789", b"abc"]])
async def test_a_body_that_is_not_its_declared_length_is_never_forwarded(
    buffer_bytes: int, chunks: list[bytes]
) -> None:
    """A server that delivers fewer or more bytes than declared: 400, no upstream request."""
    up = Recorder()
    headers: H = [(b"host", b"gw"), (b"content-length", b"10")]
    sent = await _call(_proxy(up, buffer_bytes), _scope(headers), chunks)
    assert sent[0]["status"] == 400
    assert up.requests == []


async def test_the_proxy_alone_applies_the_same_head_rules() -> None:
    """Without an admission stage the proxy parses the head itself: same refusals."""
    up = Recorder()
    app = _proxy(up)
    both: H = [(b"host", b"gw"), (b"content-length", b"2"), (b"transfer-encoding", b"chunked")]
    assert (await _call(app, _scope(both), [b"ok"]))[0]["status"] == 400
    twice: H = [(b"host", b"gw"), (b"host", b"evil")]
    assert (await _call(app, _scope(twice, "GET"), [b""]))[0]["status"] == 400
    assert (await _call(app, _scope([(b"host", b"gw")], "CONNECT"), [b""]))[0]["status"] == 405
    assert up.requests == []


async def test_the_stack_refuses_before_any_stage_and_counts_a_client_error() -> None:
    """CONNECT, a bodied Upgrade and two Hosts: refused at admission, counted by header."""
    up = Recorder()
    gw = build_gateway(
        build_config({"upstream": "http://up.test"}), transport=httpx.MockTransport(up), env={}
    )
    upgrade: H = [(b"host", b"gw"), (b"connection", b"upgrade"), (b"upgrade", b"foo")]
    cases = [
        (_scope([(b"host", b"gw"), (b"content-length", b"5")], "CONNECT"), 405),
        (_scope([*upgrade, (b"content-length", b"5")]), 400),
        (_scope([(b"host", b"gw"), (b"host", b"x")], "GET"), 400),
    ]
    for scope, status in cases:
        sent = await _call(gw, scope, [b""])
        assert sent[0]["status"] == status
        assert (b"connection", b"close") in sent[0]["headers"]
    assert up.requests == []
    text = generate_latest(gw.parts.metrics.registry).decode()
    for header in ("method", "Upgrade", "Host"):
        assert f'ballast_bad_requests_total{{header="{header}"}} 1.0' in text
    assert gw.parts.limiter.snapshot(0.0)["inflight"] == 0
