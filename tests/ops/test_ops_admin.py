"""Admin hardening and forwarded-header trust in-process (issue 11 defects 6, 8, 9; issue 13.6)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from ballast_asgi.config import build_config
from ballast_asgi.core.forwarded import (
    CLIENT_IP_KEY,
    ForwardedTrust,
    client_ip,
    forwarded_entries,
    rewritten_by_server,
)
from ballast_asgi.core.redact import redact_userinfo
from ballast_asgi.core.types import Receive, Scope, Send
from ballast_asgi.gateway import Gateway, build_gateway

pytestmark = pytest.mark.anyio


class Seen:
    """A MockTransport handler keeping every upstream request."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200, text="up")


def _gateway(seen: Seen, **data: Any) -> Gateway:
    config = build_config({"upstream": "http://user:hunter2@up.test", **data})
    return build_gateway(config, transport=httpx.MockTransport(seen), env={})


def _client(gw: Any, peer: tuple[str, int] = ("127.0.0.1", 5000)) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(gw, client=peer)
    return httpx.AsyncClient(transport=transport, base_url="http://gw")


def test_forwarded_trust_defaults_to_the_peer() -> None:
    """With no trusted proxies the originating client is the direct peer."""
    trust = ForwardedTrust()
    assert trust.client_ip("127.0.0.1", ["10.1.2.3"]) == "127.0.0.1"
    assert trust.scheme("127.0.0.1", [(b"x-forwarded-proto", b"https")]) is None


def test_forwarded_trust_walks_the_chain_from_the_right() -> None:
    """From a trusted proxy: the first untrusted entry from the right; all trusted: leftmost."""
    trust = ForwardedTrust(["10.0.0.0/8"])
    assert trust.client_ip("10.0.0.1", ["6.6.6.6", "203.0.113.9", "10.0.0.2"]) == "203.0.113.9"
    assert trust.client_ip("10.0.0.1", ["10.0.0.3:80", "10.0.0.2"]) == "10.0.0.3"
    assert trust.client_ip("127.0.0.1", ["203.0.113.9"]) == "127.0.0.1"
    assert trust.client_ip("::ffff:10.0.0.1", ["[2001:db8::1]:443"]) == "2001:db8::1"
    assert trust.scheme("10.0.0.1", [(b"x-forwarded-proto", b"HTTPS")]) == "https"
    assert trust.scheme("10.0.0.1", [(b"x-forwarded-proto", b"gopher")]) is None


def test_forwarded_entries_and_rewrite_detection() -> None:
    """Entries span repeated headers; a client equal to an entry was rewritten by the server."""
    headers = [(b"x-forwarded-for", b"1.1.1.1, 2.2.2.2"), (b"x-forwarded-for", b" 3.3.3.3:9 ")]
    entries = forwarded_entries(headers)
    assert entries == ["1.1.1.1", "2.2.2.2", "3.3.3.3:9"]
    assert rewritten_by_server(("3.3.3.3", 9), entries)
    assert not rewritten_by_server(("127.0.0.1", 5000), entries)
    assert not rewritten_by_server(None, entries)


async def test_trusted_proxy_sets_client_ip_and_scheme_not_client() -> None:
    """From a trusted proxy the gateway records the originating client; scope client stays."""
    seen: list[Scope] = []
    gw = _gateway(Seen(), proxy={"trusted_proxies": ["127.0.0.0/8"]})

    async def spy(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    gw._app = gw._stack = spy  # the admin router and its pass-through
    headers = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https"}
    async with _client(gw) as c:
        await c.get("/x", headers=headers)
    async with _client(gw, ("192.0.2.1", 7)) as c:
        await c.get("/x", headers=headers)
    assert seen[0][CLIENT_IP_KEY] == "203.0.113.9" and seen[0]["client"][0] == "127.0.0.1"
    assert seen[0]["scheme"] == "https" and client_ip(seen[0]) == "203.0.113.9"
    assert CLIENT_IP_KEY not in seen[1] and seen[1]["scheme"] == "http"
    assert client_ip(seen[1]) == "192.0.2.1"


async def test_server_rewritten_client_is_never_trusted() -> None:
    """A client taken from X-Forwarded-For by the server (port 0 or any) loses all trust."""
    seen = Seen()
    gw = _gateway(seen, priority={"trust_header": False, "trusted_networks": ["10.0.0.0/8"]})
    forged = {"X-Priority": "critical", "X-Forwarded-For": "10.1.2.3:4444"}
    async with _client(gw, ("10.1.2.3", 4444)) as c:
        assert (await c.get("/x", headers=forged)).status_code == 200
    snap = gw.snapshot()
    assert gw.metrics.priority_ignored._value.get() == 1
    assert snap["config"]["upstream"] == "http://***@up.test"


async def test_snapshot_never_shows_credentials() -> None:
    """Userinfo is redacted from the snapshot and from config errors."""
    async with _client(_gateway(Seen())) as c:
        body = (await c.get("/_ballast/snapshot")).text
    assert "hunter2" not in body and "user:" not in body
    assert redact_userinfo("x 'https://a:b@c@h/p' y") == "x 'https://***@h/p' y"
    with pytest.raises(Exception, match=r"\*\*\*@") as info:
        build_config({"upstream": "ftp://user:hunter2@x"})
    assert "hunter2" not in str(info.value)


async def test_token_required_protects_everything_but_health() -> None:
    """admin.token_required: 401 without the bearer token (any case), health stays open."""
    gw = _gateway(Seen(), admin={"token": "s3cret", "token_required": True})
    async with _client(gw) as c:
        assert (await c.get("/_ballast/health")).status_code == 200
        r = await c.get("/_ballast/snapshot")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert (await c.get("/_ballast/metrics")).status_code == 401
        for scheme in ("Bearer", "bearer", "BEARER"):
            auth = {"Authorization": f"{scheme} s3cret"}
            assert (await c.get("/_ballast/snapshot", headers=auth)).status_code == 200
        bad = {"Authorization": "Basic s3cret"}
        assert (await c.get("/_ballast/snapshot", headers=bad)).status_code == 401
    admin = gw.admin_app()
    async with _client(admin) as c:
        assert (await c.get("/snapshot")).status_code == 401
        assert (await c.get("/health")).status_code == 200


async def test_reload_accepts_lowercase_bearer() -> None:
    """Authorization: bearer (lower case) is the same scheme (RFC 9110 section 11.1)."""
    gw = _gateway(Seen(), admin={"token": "s3cret"})
    async with _client(gw) as c:
        r = await c.post("/_ballast/reload", headers={"Authorization": "bearer s3cret"})
    assert r.status_code != 401


def test_token_required_needs_a_token() -> None:
    """admin.token_required without admin.token is a config error naming the key."""
    with pytest.raises(Exception, match=r"admin\.token_required"):
        build_config({"upstream": "http://u", "admin": {"token_required": True}})


async def test_admin_off_the_traffic_port_is_404_and_never_proxied() -> None:
    """admin.on_traffic_port false: /_ballast/* is 404 on the traffic port, not proxied."""
    seen = Seen()
    gw = _gateway(seen, admin={"on_traffic_port": False})
    async with _client(gw) as c:
        for path in ("/_ballast/snapshot", "/_ballast/metrics", "/_ballast/health"):
            assert (await c.get(path)).status_code == 404
    async with _client(gw.admin_app()) as c:
        assert (await c.get("/health")).status_code == 200
    assert seen.requests == []


async def test_admin_paths_honour_root_path() -> None:
    """Under uvicorn --root-path /gw the admin paths are /gw/_ballast/*, never proxied."""
    seen = Seen()
    gw = _gateway(seen)
    transport = httpx.ASGITransport(gw, root_path="/gw")
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
        r = await c.get("/gw/_ballast/health")
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        assert (await c.get("/gw/other")).status_code == 200
    assert [str(r.url) for r in seen.requests] == ["http://up.test/other"]


async def test_install_on_a_mounted_app_serves_admin_under_the_mount() -> None:
    """install() on an app mounted at /sub answers /sub/_ballast/health."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    from ballast_asgi.gateway.embed import install

    async def hello(request: Any) -> PlainTextResponse:
        return PlainTextResponse("hi")

    inner = Starlette(routes=[Route("/hello", hello)])
    install(inner)
    outer = Starlette(routes=[Mount("/sub", app=inner)])
    async with _client(outer) as c:
        r = await c.get("/sub/_ballast/health")
        assert r.status_code == 200 and r.json() == {"status": "ok"}
        assert (await c.get("/sub/hello")).text == "hi"
        assert json.loads((await c.get("/sub/_ballast/snapshot")).text)["limiter"]


async def test_health_turns_503_while_draining() -> None:
    """gateway.draining: health answers 503 draining on both ports; traffic is still served."""
    seen = Seen()
    gw = _gateway(seen)
    gw.draining = True
    async with _client(gw) as c:
        r = await c.get("/_ballast/health")
        assert (r.status_code, r.json()) == (503, {"status": "draining"})
        assert (await c.get("/x")).status_code == 200
    async with _client(gw.admin_app()) as c:
        assert (await c.get("/health")).status_code == 503


async def test_failed_http_reload_is_logged(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rejected POST /_ballast/reload prints one line naming the problem."""
    path = tmp_path / "gw.yaml"
    path.write_text("upstream: http://up.test\nadmin: {token: s3cret}\n")
    from ballast_asgi.config import load_config

    gw = build_gateway(load_config(env={}, path=path), transport=httpx.MockTransport(Seen()),
                       config_path=path, env={})  # fmt: skip
    path.write_text("upstream: http://up.test\nadmin: {token: s3cret}\nlimiter: {min_limit: 0}\n")
    async with _client(gw) as c:
        r = await c.post("/_ballast/reload", headers={"Authorization": "Bearer s3cret"})
    assert r.status_code == 422
    err = capsys.readouterr().err
    assert "ballast: reload rejected:" in err and "limiter.min_limit" in err
