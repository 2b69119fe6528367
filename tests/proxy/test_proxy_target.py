"""Issue 11.1: the upstream URL is built from parsed parts; only origin-form targets are proxied."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ballast_asgi.core.outcome import AttemptOutcome, Outcome, limiter_signal
from ballast_asgi.core.priority import Priority
from ballast_asgi.middleware.context import RequestContext, with_context
from ballast_asgi.proxy.app import ProxyApp
from ballast_asgi.proxy.transports.aiohttp_transport import direct_url, yarl_url
from ballast_asgi.proxy.upstream import SingleUpstream, Upstream, UpstreamURLError, redact_url

HOSTILE = [
    b"*",
    b"*@127.0.0.1:9202/steal",
    b"*:pw@localhost:9202/",
    b"http://127.0.0.1:9202/x",
    b"@127.0.0.1:9202/x",
    b"127.0.0.1:9202",
    b"",
]


def _scope(raw_path: bytes, method: str = "GET", **extra: Any) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": raw_path.decode("latin-1"),
        "raw_path": raw_path,
        "query_string": b"",
        "headers": [(b"host", b"gw.test")],
        "client": ("127.0.0.1", 5000),
        "scheme": "http",
        "http_version": "1.1",
        "root_path": "",
        **extra,
    }


async def _call(app: ProxyApp, scope: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


def test_parse_splits_parts_and_hides_credentials() -> None:
    """Scheme, host, port and base path are parsed once; credentials never appear."""
    up = Upstream.parse("http://user:s3cret@Example.COM:8080/base/")
    assert (up.scheme, up.host, up.port, up.base_path) == ("http", "example.com", 8080, b"/base")
    assert up.has_credentials
    for shown in (str(up), repr(up), up.display, up.origin):
        assert "s3cret" not in shown and "user" not in shown
    assert up.display == "http://***@example.com:8080/base"


@pytest.mark.parametrize(
    "url", ["ftp://x", "127.0.0.1:9101", "http://:80", "http://h:99999", "http://h/?q=1"]
)
def test_parse_refuses_unusable_urls(url: str) -> None:
    """A URL that is not http(s)://host[:port][/base] is refused with a ValueError."""
    with pytest.raises(UpstreamURLError):
        Upstream.parse(url)


def test_parse_error_is_redacted() -> None:
    """The error for a bad URL with credentials does not echo the password."""
    with pytest.raises(UpstreamURLError) as info:
        Upstream.parse("ftp://admin:hunter2@host/")
    assert "hunter2" not in str(info.value)


def test_redact_url() -> None:
    """userinfo is replaced, the rest of the URL kept."""
    assert redact_url("http://a:b@h:1/p@x?q") == "http://***@h:1/p@x?q"
    assert redact_url("http://h:1/p@x") == "http://h:1/p@x"


@pytest.mark.parametrize("target", [b"//127.0.0.1:9202/steal", b"/a@127.0.0.1:9202/x", b"/?@x:1"])
def test_url_host_is_always_the_upstreams(target: bytes) -> None:
    """Whatever an origin-form target holds, scheme, host and port stay the upstream's."""
    up = Upstream.parse("http://127.0.0.1:9101/base")
    for url in (up.url(target), yarl_url(up.url(target))):
        assert str(url).startswith("http://127.0.0.1:9101/base/")
    y = yarl_url(up.url(target))
    assert (y.host, y.port, y.user, y.password) == ("127.0.0.1", 9101, None, None)
    assert y.raw_path_qs.encode() == b"/base" + target


@pytest.mark.parametrize("base", ["http://127.0.0.1:9101", "http://u.test/base", "https://[::1]"])
@pytest.mark.parametrize("target", [b"", b"/", b"?q=1", b"/a/b?x=%2F&y", b"//h:1/x", b"/a@h:2/x"])
def test_direct_url_is_the_httpx_paths_url(base: str, target: bytes) -> None:
    """The direct aiohttp path builds the same URL as httpx's URL converted by yarl_url."""
    up = Upstream.parse(base)
    assert direct_url(up, target) == yarl_url(up.url(target))


def test_url_refuses_non_origin_form() -> None:
    """Upstream.url refuses a target that does not start with a slash."""
    with pytest.raises(ValueError):
        Upstream.parse("http://u.test").url(b"*@evil:1/x")
    with pytest.raises(ValueError):
        direct_url(Upstream.parse("http://u.test"), b"*@evil:1/x")


def test_ipv6_upstream_url() -> None:
    """An IPv6 upstream keeps its brackets in Host and in aiohttp's URL."""
    up = Upstream.parse("http://[::1]:8080")
    assert up.netloc == b"[::1]:8080"
    assert yarl_url(up.url(b"/x")).host == "::1"


def test_single_selector_always_chooses_its_upstream() -> None:
    """The default selector has one upstream, also for a retry that excludes it."""
    up = Upstream.parse("http://u.test")
    selector = SingleUpstream(up)
    assert selector.choose(None, (up,)) is up
    assert list(selector.upstreams()) == [up]


@pytest.mark.anyio
@pytest.mark.parametrize("target", HOSTILE)
async def test_non_origin_form_target_is_400_without_upstream_call(target: bytes) -> None:
    """`*`, `*@host`, absolute-form and empty targets get 400; the transport is never called."""
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200)

    app = ProxyApp("http://127.0.0.1:9101", transport=httpx.MockTransport(handler))
    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    sent = await _call(app, with_context(_scope(target, "OPTIONS"), ctx))
    assert sent[0]["status"] == 400
    assert calls == []
    assert ctx.outcome is AttemptOutcome.GATEWAY_ERROR
    assert limiter_signal(ctx.outcome) is Outcome.IGNORED


@pytest.mark.anyio
async def test_attempt_outcome_and_head_rtt_recorded_before_head() -> None:
    """The proxy records outcome and time to head on the context before the head is sent."""
    now = [10.0]

    async def handler(request: httpx.Request) -> httpx.Response:
        now[0] += 0.25
        return httpx.Response(503, content=b"x")

    app = ProxyApp("http://u.test", transport=httpx.MockTransport(handler), clock=lambda: now[0])
    ctx = RequestContext(arrival=0.0, deadline=None, priority=Priority.STANDARD)
    seen: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            seen.append((ctx.outcome, ctx.rtt_s, ctx.tried_upstreams))

    await app(with_context(_scope(b"/x"), ctx), receive, send)
    assert seen == [(AttemptOutcome.STATUS_5XX, 0.25, (app.upstream,))]


def test_snapshot_and_config_errors_never_show_credentials() -> None:
    """An upstream URL's password appears neither in /snapshot nor in a config error."""
    from ballast_asgi.config import build_config
    from ballast_asgi.core.errors import ConfigError
    from ballast_asgi.gateway import build_gateway

    gateway = build_gateway(build_config({"upstream": "http://svc:hunter2@127.0.0.1:9101"}))
    assert "hunter2" not in str(gateway.snapshot())
    assert gateway.snapshot()["config"]["upstream"] == "http://***@127.0.0.1:9101"
    with pytest.raises(ConfigError) as info:
        build_config({"upstream": "ftp://svc:hunter2@127.0.0.1:9101"})
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        (b"http://127.0.0.1:9101/base/next?q=1", b"https://gw.test/api/next?q=1"),
        (b"HTTP://127.0.0.1:9101/base", b"https://gw.test/api"),
        (b"/base/rel", b"/api/rel"),
        (b"/basement", b"/basement"),
        (b"http://127.0.0.1:9101/other", b"http://127.0.0.1:9101/other"),
        (b"http://elsewhere/base/x", b"http://elsewhere/base/x"),
        (b"next", b"next"),
    ],
)
def test_location_rewrite(location: bytes, expected: bytes) -> None:
    """Only a Location under the upstream's origin and base path moves to the gateway's."""
    from ballast_asgi.proxy.redirects import rewrite_locations

    up = Upstream.parse("http://127.0.0.1:9101/base")
    scope = _scope(b"/api/x", root_path="/api", scheme="https")
    headers = [(b"location", location), (b"x-other", location)]
    out = rewrite_locations(headers, up, scope, b"gw.test")  # the Host from the request head
    assert out == [(b"location", expected), (b"x-other", location)]
