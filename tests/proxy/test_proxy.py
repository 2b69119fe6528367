"""The proxy contract, run over httpx.MockTransport and over real sockets (lean, aiohttp, httpx)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio.lowlevel
import httpx
import pytest

from ballast_asgi.config import ProxyConfig
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.priority import Priority
from ballast_asgi.middleware.context import RequestContext, with_context
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.transports import make_transport
from ballast_asgi.telemetry.metrics import null_metrics
from tests.proxy_upstream import BIG_BODY, GZIP_BODY, mock_handler, real_upstream

MakeProxy = Callable[..., ProxyApp]


@pytest.fixture(params=["mock", "lean", "aiohttp", "httpx"])
async def make_proxy(request: pytest.FixtureRequest) -> AsyncIterator[MakeProxy]:
    """Builds ProxyApps over the parametrised upstream; closes them afterwards."""
    apps: list[ProxyApp] = []

    async def run(url: str) -> AsyncIterator[MakeProxy]:
        def make(config: ProxyConfig | None = None, **kw: Any) -> ProxyApp:
            config = config or ProxyConfig()
            if request.param == "mock":
                transport: httpx.AsyncBaseTransport = httpx.MockTransport(mock_handler)
            else:
                transport = make_transport(config.model_copy(update={"transport": request.param}))
            app = ProxyApp(kw.pop("upstream", url), config=config, transport=transport, **kw)
            apps.append(app)
            return app

        yield make
        for app in apps:
            await app.aclose()

    if request.param == "mock":
        async for make in run("http://upstream.test:8080"):
            yield make
    else:
        async with real_upstream() as url:
            async for make in run(url):
                yield make


def client_for(app: Any, root_path: str = "") -> httpx.AsyncClient:
    """A test client through ASGITransport with none of httpx's default headers."""
    transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 5555), root_path=root_path)
    client = httpx.AsyncClient(transport=transport, base_url="http://gw.test")
    for name in list(client.headers):
        del client.headers[name]
    return client


def headers_of(echo: dict[str, Any]) -> list[tuple[str, str]]:
    """The header list the upstream received."""
    return [(k, v) for k, v in echo["headers"]]


async def echo(app: Any, method: str = "GET", url: str = "/echo", **kw: Any) -> dict[str, Any]:
    """Send one request through the proxy and return what the upstream saw."""
    async with client_for(app) as client:
        response = await client.request(method, url, **kw)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.anyio
async def test_method_path_headers_and_body_forwarded(make_proxy: MakeProxy) -> None:
    """Method, path, repeated headers and body reach the upstream unchanged."""
    seen = await echo(
        make_proxy(), "PUT", "/a/b", content=b"\x00\xffbody",
        headers=[("x-rep", "1"), ("x-rep", "2"), ("content-type", "application/x-thing")],
    )  # fmt: skip
    assert seen["method"] == "PUT"
    assert seen["target"] == "/a/b"
    assert seen["body"] == "\x00\xffbody"
    hdrs = headers_of(seen)
    assert [v for k, v in hdrs if k == "x-rep"] == ["1", "2"]
    assert ("content-type", "application/x-thing") in hdrs


@pytest.mark.anyio
@pytest.mark.parametrize(
    "target",
    ["/p?a=%2F&b=x+y&c=%E2%9C%93", "/a%2Fb/c?q=1&q=2", "/p?empty=&flag", "/%7Euser?x=%25"],
)
async def test_query_and_encoded_path_forwarded_byte_for_byte(
    make_proxy: MakeProxy, target: str
) -> None:
    """Raw query strings and percent-encoded paths are not re-encoded or decoded."""
    assert (await echo(make_proxy(), url=target))["target"] == target


@pytest.mark.anyio
async def test_unicode_path_is_percent_encoded_once(make_proxy: MakeProxy) -> None:
    """A unicode path goes upstream as its UTF-8 percent-encoding."""
    seen = await echo(make_proxy(), url="/caf\u00e9?q=\u2713")
    assert seen["target"] == "/caf%C3%A9?q=%E2%9C%93"


@pytest.mark.anyio
async def test_upstream_base_path_is_prefixed(make_proxy: MakeProxy) -> None:
    """An upstream URL with a path prefixes every forwarded path."""
    base = make_proxy()
    app = make_proxy(upstream=base.upstream.origin + "/base/")
    assert (await echo(app, url="/x?y=1"))["target"] == "/base/x?y=1"


@pytest.mark.anyio
async def test_hop_by_hop_request_headers_removed(make_proxy: MakeProxy) -> None:
    """Connection, the headers it names, Keep-Alive, TE, Trailer, Upgrade and Proxy-* stay here."""
    hop = [("connection", "x-private, Keep-Alive"), ("x-private", "1"), ("keep-alive", "5"),
           ("te", "trailers"), ("trailer", "x-t"), ("upgrade", "websocket"),
           ("proxy-authorization", "Basic xx"), ("x-normal", "1")]  # fmt: skip
    names = {k for k, _ in headers_of(await echo(make_proxy(), headers=hop))}
    assert "x-normal" in names
    assert not names & {"connection", "x-private", "keep-alive", "te", "trailer", "upgrade",
                        "proxy-authorization"}  # fmt: skip


@pytest.mark.anyio
async def test_hop_by_hop_response_headers_removed(make_proxy: MakeProxy) -> None:
    """Hop-by-hop response headers (and those Connection names) are not passed back."""
    async with client_for(make_proxy()) as client:
        response = await client.get("/hop")
    assert response.headers["x-kept"] == "yes"
    for name in ("x-secret", "keep-alive", "proxy-authenticate", "upgrade"):
        assert name not in response.headers


@pytest.mark.anyio
async def test_forwarded_headers_and_upstream_host(make_proxy: MakeProxy) -> None:
    """Host becomes the upstream's; X-Forwarded-For/-Proto/-Host describe the client."""
    app = make_proxy()
    hdrs = dict(headers_of(await echo(app, headers={"x-forwarded-for": "1.2.3.4"})))
    assert hdrs["host"] == app.upstream.netloc.decode()
    assert hdrs["x-forwarded-for"] == "1.2.3.4, 10.0.0.7"
    assert hdrs["x-forwarded-proto"] == "http"
    assert hdrs["x-forwarded-host"] == "gw.test"


@pytest.mark.anyio
async def test_no_added_user_agent_accept_encoding_or_accept(make_proxy: MakeProxy) -> None:
    """The proxy adds no User-Agent, Accept-Encoding or Accept of its own."""
    names = {k for k, _ in headers_of(await echo(make_proxy()))}
    assert not names & {"user-agent", "accept-encoding", "accept", "cookie"}


@pytest.mark.anyio
async def test_repeated_set_cookie_kept_and_never_stored(make_proxy: MakeProxy) -> None:
    """Both Set-Cookie headers come back, and no cookie is sent on a later request."""
    app = make_proxy()
    async with client_for(app) as client:
        response = await client.get("/cookies")
        client.cookies.clear()
        later = (await client.get("/echo")).json()
    assert response.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
    assert "cookie" not in dict(headers_of(later))


@pytest.mark.anyio
async def test_gzip_body_passed_undecoded(make_proxy: MakeProxy) -> None:
    """A gzip response keeps its Content-Encoding and compressed bytes."""
    async with client_for(make_proxy()) as client, client.stream("GET", "/gzip") as response:
        raw = b"".join([chunk async for chunk in response.aiter_raw()])
    assert response.headers["content-encoding"] == "gzip"
    assert raw == GZIP_BODY


@pytest.mark.anyio
@pytest.mark.parametrize("size", [0, 1, 3 * 1024 * 1024])
async def test_request_bodies_of_any_size(make_proxy: MakeProxy, size: int) -> None:
    """Empty and large request bodies arrive byte for byte."""
    body = bytes(i % 251 for i in range(size))
    seen = await echo(make_proxy(), "POST", content=body)
    assert seen["body"].encode("latin-1") == body
    if size:
        assert dict(headers_of(seen))["content-length"] == str(size)


@pytest.mark.anyio
async def test_chunked_request_body_arrives_whole(make_proxy: MakeProxy) -> None:
    """A chunked request body streams upstream complete, still chunked (nothing added)."""

    async def parts() -> AsyncIterator[bytes]:
        for part in (b"one,", b"two,", b"three"):
            yield part

    seen = await echo(make_proxy(), "POST", content=parts())
    assert seen["body"] == "one,two,three"
    assert "content-length" not in dict(headers_of(seen))
    assert dict(headers_of(seen)).get("transfer-encoding") == "chunked"


@pytest.mark.anyio
async def test_large_response_streamed_back(make_proxy: MakeProxy) -> None:
    """A 1 MiB response body comes back intact."""
    async with client_for(make_proxy()) as client:
        response = await client.get("/big")
    assert response.content == BIG_BODY


@pytest.mark.anyio
async def test_head_has_headers_but_no_body(make_proxy: MakeProxy) -> None:
    """HEAD passes the upstream's headers (incl. Content-Length) and no body."""
    async with client_for(make_proxy()) as client:
        response = await client.head("/echo")
    assert response.status_code == 200
    assert response.content == b""


@pytest.mark.anyio
@pytest.mark.parametrize("status", [204, 304])
async def test_no_body_statuses(make_proxy: MakeProxy, status: int) -> None:
    """204 and 304 come back with their headers and without a body."""
    async with client_for(make_proxy()) as client:
        response = await client.get(f"/status/{status}")
    assert response.status_code == status
    assert response.headers["etag"] == '"v1"'
    assert response.content == b""


@pytest.mark.anyio
@pytest.mark.parametrize("declared", [True, False])
async def test_body_over_limit_is_413_without_upstream_call(declared: bool) -> None:
    """A body over max_body_bytes gets 413 (by Content-Length or by counting) and no call."""
    calls: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda r: calls.append(r) or httpx.Response(200))
    app = ProxyApp("http://u.test", config=ProxyConfig(max_body_bytes=10), transport=transport)

    async def parts() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"12345"

    content: Any = b"x" * 11 if declared else parts()
    async with client_for(app) as client:
        response = await client.post("/", content=content)
    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert calls == []


@pytest.mark.anyio
async def test_connect_error_is_502(make_proxy: MakeProxy, unused_port: int) -> None:
    """An unreachable upstream gives 502 bad_gateway with a small JSON body."""
    base = make_proxy()
    refused = "http://upstream.test:8080/refuse" if base.upstream.host == "upstream.test" else (
        f"http://127.0.0.1:{unused_port}"
    )  # fmt: skip
    metrics = null_metrics()
    app = make_proxy(upstream=refused, metrics=metrics)
    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    async with client_for(_with_ctx(app, ctx)) as client:
        response = await client.get("/x")
    assert response.status_code == 502
    assert response.json()["error"] == "bad_gateway"
    assert "Traceback" not in response.text
    assert ctx.outcome is AttemptOutcome.CONNECT_ERROR
    assert metrics.upstream_errors.labels("connect")._value.get() == 1


@pytest.mark.anyio
async def test_timeout_is_504(make_proxy: MakeProxy) -> None:
    """An upstream slower than timeout_ms gives 504 and marks the context dropped."""
    app = make_proxy(ProxyConfig(timeout_ms=100))
    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    async with client_for(_with_ctx(app, ctx)) as client:
        response = await client.get("/slow")
    assert response.status_code == 504
    assert response.json()["error"] == "gateway_timeout"
    assert ctx.outcome is AttemptOutcome.TIMEOUT


@pytest.mark.anyio
async def test_deadline_forwarded_as_remaining_ms(make_proxy: MakeProxy) -> None:
    """With a deadline, X-Deadline-Ms carries the remaining budget and replaces the client's."""
    now = 100.0
    app = make_proxy(clock=lambda: now)
    ctx = RequestContext(arrival=now, deadline=now + 1.25, priority=Priority.STANDARD)
    async with client_for(_with_ctx(app, ctx)) as client:
        seen = (await client.get("/echo", headers={"x-deadline-ms": "5000"})).json()
    assert [v for k, v in headers_of(seen) if k == "x-deadline-ms"] == ["1250"]


@pytest.mark.anyio
async def test_expired_deadline_is_504_without_upstream_call() -> None:
    """A deadline already passed gives 504 and never calls the upstream."""
    calls: list[httpx.Request] = []
    transport = httpx.MockTransport(lambda r: calls.append(r) or httpx.Response(200))
    app = ProxyApp("http://u.test", transport=transport, clock=lambda: 50.0)
    ctx = RequestContext(arrival=49.0, deadline=49.5, priority=Priority.STANDARD)
    async with client_for(_with_ctx(app, ctx)) as client:
        response = await client.get("/")
    assert response.status_code == 504
    assert calls == []
    assert ctx.outcome is AttemptOutcome.DEADLINE


@pytest.mark.anyio
async def test_timeout_at_the_deadline_is_kind_deadline() -> None:
    """A timeout that only enforced the request's budget is reported as `deadline`."""
    now = [10.0]

    def hang(request: httpx.Request) -> httpx.Response:
        now[0] = 10.5
        raise httpx.ReadTimeout("slow", request=request)

    app = ProxyApp("http://u.test", transport=httpx.MockTransport(hang), clock=lambda: now[0])
    ctx = RequestContext(arrival=10.0, deadline=10.5, priority=Priority.STANDARD)
    async with client_for(_with_ctx(app, ctx)) as client:
        response = await client.get("/")
    assert response.status_code == 504
    assert ctx.outcome is AttemptOutcome.DEADLINE


@pytest.mark.anyio
async def test_upstream_timeout_comes_from_deadline() -> None:
    """The remaining budget becomes every httpx timeout of the upstream call."""
    seen: list[dict[str, float]] = []
    transport = httpx.MockTransport(
        lambda r: seen.append(r.extensions["timeout"]) or httpx.Response(200)
    )
    app = ProxyApp("http://u.test", transport=transport, clock=lambda: 10.0)
    ctx = RequestContext(arrival=10.0, deadline=10.75, priority=Priority.STANDARD)
    async with client_for(_with_ctx(app, ctx)) as client:
        await client.get("/")
    assert seen[0]["read"] == pytest.approx(0.75)
    assert seen[0]["connect"] == pytest.approx(0.75)


@pytest.mark.anyio
async def test_mounted_under_root_path(make_proxy: MakeProxy) -> None:
    """Mounted at /api (Starlette Mount semantics), /api/users?x=1 goes upstream as /users?x=1."""
    from starlette.applications import Starlette
    from starlette.routing import Mount

    app = make_proxy()
    outer = Starlette(routes=[Mount("/api", app=app)])
    assert (await echo(outer, url="/api/users?x=%2F"))["target"] == "/users?x=%2F"
    assert (await echo(outer, url="/api/"))["target"] == "/"
    async with client_for(app, root_path="/api") as client:
        assert (await client.get("/api")).json()["target"] == "/"


@pytest.mark.anyio
async def test_client_disconnect_stops_reading_upstream() -> None:
    """When the client leaves mid-response the proxy stops reading and closes upstream."""
    state = {"chunks": 0, "closed": False}

    class Endless(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            while state["chunks"] < 10_000:
                state["chunks"] += 1
                yield b"x" * 100

        async def aclose(self) -> None:
            state["closed"] = True

    transport = httpx.MockTransport(lambda r: httpx.Response(200, stream=Endless()))
    app = ProxyApp("http://u.test", transport=transport)
    messages = iter([{"type": "http.request", "body": b""}])
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return next(messages, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        await anyio.lowlevel.checkpoint()

    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/",
        "raw_path": b"/",
        "query_string": b"",
        "headers": [],
        "scheme": "http",
        "client": ("1.2.3.4", 1),
        "root_path": "",
    }
    await app(with_context(scope, ctx), receive, send)
    await app.aclose()
    assert ctx.outcome is AttemptOutcome.SUCCESS  # recorded at the head; the client left later
    assert state["closed"]
    assert state["chunks"] < 10


@pytest.mark.anyio
async def test_lifespan_creates_and_closes_the_client() -> None:
    """Lifespan startup opens the shared client and shutdown closes it."""
    app = ProxyApp("http://u.test", transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    inbox = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    replies: list[str] = []

    async def receive() -> dict[str, Any]:
        return next(inbox)

    async def send(message: dict[str, Any]) -> None:
        replies.append(message["type"])
        if message["type"] == "lifespan.startup.complete":
            assert not app.client.is_closed

    await app({"type": "lifespan"}, receive, send)
    assert replies == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert not app.connections.is_open


def _with_ctx(app: Any, ctx: RequestContext) -> Any:
    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        await app(with_context(scope, ctx), receive, send)

    return wrapped


@pytest.fixture
def unused_port() -> int:
    """A loopback port with nothing listening on it."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
