"""The request head is read once per proxied request (issue 29 item 4).

Admission reads the head (``core/head.read_head``: target, framing, lengths,
priority, deadline, Host, consumer key) into ``ctx.head``; the classifier, the
later stages and the proxy use that value. These tests count, for a request
through the whole gateway: parser calls, Python walks of the client's header
list (a marker field first in the list counts every loop that unpacks or
indexes it) and computations of a response head's outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, SupportsIndex

import httpx
import pytest

from ballast_asgi.config import build_config
from ballast_asgi.gateway import build_gateway
from ballast_asgi.middleware import admission, breaker, context
from ballast_asgi.proxy import app as proxy_app
from tests.pure import on_the_sources

pytestmark = pytest.mark.anyio


class Marker(tuple[bytes, bytes]):
    """A header field that counts how often a loop over the header list touches it."""

    touched = 0

    def __iter__(self) -> Iterator[bytes]:
        Marker.touched += 1
        return super().__iter__()

    def __getitem__(self, index: SupportsIndex | slice) -> Any:  # type: ignore[override]
        Marker.touched += 1
        return super().__getitem__(index)


def _counting(calls: list[str], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return fn(*args, **kwargs)

    return counted


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of the head parser and of ``status_outcome``, wherever it is made."""
    seen: list[str] = []
    for module in (admission, proxy_app):
        monkeypatch.setattr(module, "read_head", _counting(seen, "read_head", module.read_head))
    for module in (context, breaker, proxy_app):
        fn = module.status_outcome
        monkeypatch.setattr(module, "status_outcome", _counting(seen, "status_outcome", fn))
    return seen


SEEN: list[httpx.Request] = []


def _upstream(request: httpx.Request) -> httpx.Response:
    SEEN.append(request)
    location = {"location": "http://up.test/next"} if request.url.path == "/moved" else {}
    return httpx.Response(302 if location else 200, headers=location, content=b"ok")


async def _proxied(
    config: dict[str, Any], method: str, path: str, body: bytes = b""
) -> dict[str, Any]:
    """One request through the gateway (as ``serve`` runs it); its response head."""
    SEEN.clear()
    cfg = build_config({"upstream": "http://up.test", **config})
    gw = build_gateway(cfg, transport=httpx.MockTransport(_upstream), env={})
    gw.server_may_rewrite = False  # as the CLI and ``serve`` run it (no proxy-headers rewrite)
    Marker.touched = 0
    headers: list[tuple[bytes, bytes]] = [Marker((b"host", b"gw.test")), (b"accept", b"*/*")]
    if body:
        headers.append((b"content-length", str(len(body)).encode()))
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop() if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }  # fmt: skip
    await gw(scope, receive, send)
    return sent[0]


@pytest.mark.parametrize(
    ("config", "method", "path", "body"),
    [
        ({}, "GET", "/x", b""),
        ({}, "POST", "/x", b"payload"),  # through the body stage and a replayable body
        ({"proxy": {"preserve_host": True}}, "GET", "/x", b""),  # the client's Host upstream
        ({}, "GET", "/moved", b""),  # a Location moved to the client's Host
        ({"priority": {"consumers": {"keys": {"k1": "critical"}}}}, "GET", "/x", b""),
    ],
    ids=["get", "post", "preserve_host", "location", "consumer_keys"],
)
async def test_a_proxied_request_reads_its_head_once(
    calls: list[str],
    config: dict[str, Any],
    method: str,
    path: str,
    body: bytes,
    request: pytest.FixtureRequest,
) -> None:
    """One parse, two walks of the header list (the head, the forwarded copy), one outcome.

    Counted on the sources (``on_the_sources``): compiled callers call the parser
    directly and index the header tuples without the counting methods."""
    if not on_the_sources(request.node.nodeid):
        return
    head = await _proxied(config, method, path, body)
    assert head["status"] == (302 if path == "/moved" else 200)
    assert calls.count("read_head") == 1
    assert calls.count("status_outcome") == 1
    assert Marker.touched == 2


async def test_the_marker_counts_a_walk() -> None:
    """The counting field sees a ``for name, value in headers`` loop and an indexing one."""
    Marker.touched = 0
    headers = [Marker((b"a", b"1")), (b"b", b"2")]
    for _name, _value in headers:
        pass
    assert [h for h in headers if h[0] != b"b"] == [(b"a", b"1")]
    assert Marker.touched == 2


async def test_the_hosts_taken_from_the_head_are_the_clients() -> None:
    """preserve_host sends the client's Host upstream; a Location moves to the client's Host."""
    await _proxied({"proxy": {"preserve_host": True}}, "GET", "/x")
    assert [r.headers["host"] for r in SEEN] == ["gw.test"]
    head = await _proxied({}, "GET", "/moved")
    assert [r.headers["host"] for r in SEEN] == ["up.test"]
    assert dict(head["headers"])[b"location"] == b"http://gw.test/next"
