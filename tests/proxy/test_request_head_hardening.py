"""The request head, read once at admission: targets, header limits, lengths, X-Priority.

In-process against the composed gateway (MockTransport upstream that records what it gets).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ballast_asgi.config import build_config
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.head import HeadLimits, check_target, read_head
from ballast_asgi.core.types import Message
from ballast_asgi.gateway import Gateway, build_gateway

pytestmark = pytest.mark.anyio


class Recorder:
    """Upstream handler: records each request's headers and answers 200."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, content=b"ok")


def _gateway(up: Recorder, **config: Any) -> Gateway:
    cfg = build_config({"upstream": "http://up.test", **config})
    return build_gateway(cfg, transport=httpx.MockTransport(up), env={})


async def _raw(
    gw: Gateway,
    *,
    method: str = "GET",
    target: bytes = b"/",
    headers: list[tuple[bytes, bytes]] | None = None,
    body: list[Message] | None = None,
) -> list[Message]:
    """One request as a server would hand it over; returns what the gateway sent."""
    incoming = list(body or [{"type": "http.request", "body": b"", "more_body": False}])
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http", "http_version": "1.1", "method": method, "scheme": "http",
        "path": target.decode("latin-1"), "raw_path": target, "query_string": b"",
        "root_path": "", "headers": headers or [(b"host", b"gw")],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080),
    }  # fmt: skip
    await gw(scope, receive, send)
    return sent


@pytest.mark.parametrize(
    "target", [b"*", b"*@127.0.0.1:9202/steal", b"*:pw@evil:1/", b"http://evil/x", b"evil:80"]
)
async def test_a_target_that_is_not_origin_form_gets_400_and_no_upstream_call(
    target: bytes,
) -> None:
    """`*`, `*@host/...`, absolute and authority forms are refused before anything else."""
    up = Recorder()
    gw = _gateway(up)
    for method in ("GET", "OPTIONS", "POST"):
        sent = await _raw(gw, method=method, target=target)
        assert sent[0]["status"] == 400
    assert up.requests == []


async def test_a_hundred_malformed_requests_leave_the_breaker_closed() -> None:
    """Refused targets count as nothing: the breaker stays closed, healthy traffic is served."""
    up = Recorder()
    gw = _gateway(up, breaker={"consecutive_failures": 2, "min_failing_clients": 1})
    for _ in range(100):
        assert (await _raw(gw, method="OPTIONS", target=b"*"))[0]["status"] == 400
    breakers = [gw.snapshot()["breaker"]] + [
        r["breaker"] for r in gw.snapshot()["routes"].values() if r["breaker"] is not None
    ]
    assert all(b["state"] == "closed" and b["window_calls"] == 0 for b in breakers)
    assert (await _raw(gw, target=b"/healthy"))[0]["status"] == 200
    assert gw.parts.limiter.inflight == 0


async def test_too_many_headers_get_431_before_the_body() -> None:
    """More header fields than admission.max_headers: 431, the body is never read."""
    up = Recorder()
    gw = _gateway(up, admission={"max_headers": 10})
    headers = [(b"x-h%d" % i, b"v") for i in range(11)]
    body: list[Message] = []  # reading it would return a disconnect
    sent = await _raw(gw, headers=headers, body=body)
    assert sent[0]["status"] == 431 and up.requests == []


async def test_too_large_headers_get_431() -> None:
    """More header bytes than admission.max_header_bytes: 431 with a message naming them."""
    up = Recorder()
    gw = _gateway(up)
    sent = await _raw(gw, headers=[(b"x-big", b"a" * 40_000)])
    assert sent[0]["status"] == 431 and b"headers" in sent[1]["body"]
    assert up.requests == []


async def test_a_declared_body_over_the_limit_gets_413_before_any_read() -> None:
    """Content-Length above proxy.max_body_bytes: 413 at once, no byte read, nothing reserved."""
    up = Recorder()
    gw = _gateway(up, proxy={"max_body_bytes": 1000})
    reads: list[int] = []
    body: list[Message] = []

    async def check() -> None:
        sent = await _raw(gw, method="POST", headers=[(b"content-length", b"134217728")], body=body)
        reads.append(len(body))
        assert sent[0]["status"] == 413

    await check()
    assert up.requests == [] and gw.parts.capacity is not None
    assert gw.parts.capacity.byte_budget.used_bytes == 0


async def test_disagreeing_duplicate_deadlines_get_400() -> None:
    """Two X-Deadline-Ms values that differ: 400 naming the header (equal ones are fine)."""
    up = Recorder()
    gw = _gateway(up)
    bad = await _raw(gw, headers=[(b"x-deadline-ms", b"100"), (b"x-deadline-ms", b"900")])
    same = await _raw(gw, headers=[(b"x-deadline-ms", b"900"), (b"x-deadline-ms", b"900")])
    assert bad[0]["status"] == 400 and b"X-Deadline-Ms" in bad[1]["body"]
    assert same[0]["status"] == 200


async def test_an_ignored_x_priority_is_not_forwarded_and_a_trusted_one_is_normalised() -> None:
    """Untrusted X-Priority is stripped; a trusted one reaches the upstream as the tier name."""
    up = Recorder()
    untrusting = _gateway(up, priority={"trust_header": False})
    await _raw(untrusting, headers=[(b"x-priority", b"critical"), (b"x-priority", b"junk")])
    trusting = _gateway(up)
    await _raw(trusting, headers=[(b"x-priority", b"0")])
    assert "x-priority" not in up.requests[0].headers
    assert up.requests[1].headers.get_list("x-priority") == ["critical"]


async def test_trailers_appended_by_the_server_do_not_reach_the_upstream() -> None:
    """A server appending chunked trailers to scope["headers"] changes nothing forwarded."""
    up = Recorder()
    gw = _gateway(up)
    headers = [(b"transfer-encoding", b"chunked"), (b"content-type", b"text/plain")]

    body: list[Message] = [{"type": "http.request", "body": b"data", "more_body": False}]
    original = headers

    class Appending(list[Message]):
        def pop(self, index: Any = -1) -> Message:
            original.append((b"x-priority", b"critical"))  # trailers arrive with the last chunk
            original.append((b"x-trailer", b"t"))
            return super().pop(index)

    sent = await _raw(gw, method="PUT", headers=headers, body=Appending(body))
    assert sent[0]["status"] == 200
    forwarded = up.requests[0].headers
    assert "x-trailer" not in forwarded and "x-priority" not in forwarded


def test_read_head_is_one_pass_over_the_headers() -> None:
    """read_head keeps length, chunked, idempotency key, priority and deadline."""
    head = read_head(
        [
            (b"content-length", b"12"),
            (b"idempotency-key", b"k"),
            (b"x-priority", b"bulk"),
            (b"x-deadline-ms", b"250"),
        ],
        HeadLimits(),
    )
    assert (head.content_length, head.idempotency_key, head.priority, head.deadline) == (
        12,
        True,
        b"bulk",
        b"250",
    )
    assert head.has_body and not head.chunked
    with pytest.raises(HeaderError) as exc:
        read_head([(b"content-length", b"1"), (b"content-length", b"2")], HeadLimits())
    assert exc.value.status == 400
    with pytest.raises(HeaderError):
        check_target(b"*")
    check_target(b"/ok")


@pytest.mark.parametrize(
    ("raw_path", "path"),
    [(b"*", "*"), (b"/ok", "ok"), (None, "http://evil/x"), (b"", "*"), (b"http://e/x", "/x")],
)
def test_check_target_wants_both_paths_origin_form(raw_path: bytes | None, path: str) -> None:
    """Admission's one target check refuses what the proxy's ``origin_form`` refused."""
    from ballast_asgi.proxy.headers import origin_form

    with pytest.raises(HeaderError) as exc:
        check_target(raw_path, path)
    assert exc.value.status == 400
    assert not origin_form({"raw_path": raw_path, "path": path})


def test_read_head_keeps_host_every_priority_and_the_consumer_key() -> None:
    """One walk keeps Host, each X-Priority value in order and the first consumer key."""
    headers = [
        (b"host", b"gw.test"),
        (b"x-priority", b"critical"),
        (b"x-api-key", b"gold"),
        (b"x-priority", b"0"),
        (b"x-api-key", b"etl"),
        (b"x-priority", b"bulk"),
    ]
    head = read_head(headers, HeadLimits(), "GET", b"x-api-key")
    assert head.host == b"gw.test" and head.priority == b"critical"
    assert head.more_priorities == (b"0", b"bulk") and head.consumer_key == b"gold"
    assert read_head(headers, HeadLimits()).consumer_key is None  # not asked for
