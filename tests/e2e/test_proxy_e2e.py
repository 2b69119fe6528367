"""ProxyApp on real uvicorn (lifespan on) in front of a real uvicorn upstream, on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ballast_asgi.config import ProxyConfig
from ballast_asgi.proxy.app import ProxyApp
from tests.e2e.support import free_port, thread_servers

pytestmark = pytest.mark.e2e


async def upstream_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A tiny raw-ASGI upstream: /cookies sets two cookies, everything else echoes."""
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["path"] == "/cookies":
        headers = [(b"set-cookie", b"a=1"), (b"set-cookie", b"b=2"), (b"content-length", b"2")]
        payload = b"ok"
    else:
        echo = {
            "path": scope["raw_path"].decode(),
            "query": scope["query_string"].decode(),
            "headers": [[k.decode(), v.decode()] for k, v in scope["headers"]],
            "body": body.decode("latin-1"),
        }
        payload = json.dumps(echo).encode()
        headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


@pytest.fixture
def serve() -> Iterator[Any]:
    """Starts uvicorn servers in threads; stops them all at teardown."""
    with thread_servers() as start:
        yield lambda app: f"http://127.0.0.1:{start(app)}"


def test_forwards_query_headers_and_body_end_to_end(serve: Any) -> None:
    """Through real sockets: raw query, repeated headers, body, X-Forwarded-* all arrive."""
    gateway = serve(ProxyApp(serve(upstream_app)))
    with httpx.Client(base_url=gateway) as client:
        r = client.post("/a%2Fb?x=%2F+y&u=%E2%9C%93", content=b"payload",
                        headers=[("x-rep", "1"), ("x-rep", "2"), ("connection", "x-gone"),
                                 ("x-gone", "1")])  # fmt: skip
    seen = r.json()
    headers = [tuple(h) for h in seen["headers"]]
    assert seen["path"] == "/a%2Fb"
    assert seen["query"] == "x=%2F+y&u=%E2%9C%93"
    assert seen["body"] == "payload"
    assert [v for k, v in headers if k == "x-rep"] == ["1", "2"]
    assert ("x-forwarded-for", "127.0.0.1") in headers
    assert not {"x-gone", "connection"} & {k for k, _ in headers}


def test_repeated_set_cookie_end_to_end(serve: Any) -> None:
    """Both Set-Cookie headers reach the client through real uvicorn."""
    gateway = serve(ProxyApp(serve(upstream_app)))
    with httpx.Client(base_url=gateway) as client:
        r = client.get("/cookies")
    assert r.headers.get_list("set-cookie") == ["a=1", "b=2"]


def test_unreachable_upstream_is_502_end_to_end(serve: Any) -> None:
    """With nothing listening upstream the client gets 502 JSON, and the server stays up."""
    gateway = serve(ProxyApp(f"http://127.0.0.1:{free_port()}"))
    with httpx.Client(base_url=gateway) as client:
        first = client.get("/x")
        second = client.get("/y")
    assert (first.status_code, second.status_code) == (502, 502)
    assert first.json()["error"] == "bad_gateway"


def test_httpx_transport_end_to_end(serve: Any) -> None:
    """The httpx transport (config.transport='httpx') carries the same request end to end."""
    app = ProxyApp(serve(upstream_app), config=ProxyConfig(transport="httpx"))
    gateway = serve(app)
    with httpx.Client(base_url=gateway) as client:
        r = client.get("/p?q=1")
    assert r.json()["query"] == "q=1"
