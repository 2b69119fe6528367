"""Issue 11.1 fuzz: hostile request lines never reach another host (real uvicorn gateway, loopback).

Hypothesis builds request lines (methods, targets that embed a second
"evil" listener's address after `*`, `@`, `//`, absolute-form, random bytes),
header names and values, with and without a body, and sends each over a raw
socket to ``uvicorn ballast_asgi.gateway:app``. Every request must get exactly
one response; the evil listener must see no connection at all; at the end the
gateway's snapshot shows nothing in flight, held or buffered.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.e2e.raw_http import CountingListener, exchange, parse_responses
from tests.e2e.support import free_port, serve_in_thread, stop_thread, uvicorn_gateway

pytestmark = pytest.mark.e2e
Headers = list[tuple[bytes, bytes]]


class _Upstream:
    """The configured upstream: counts requests, answers 200 "ok"."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        with self._lock:
            self.count += 1
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Upstream, evil listener and the gateway (uvicorn subprocess) for the whole module."""
    upstream = _Upstream()
    port = free_port()
    server, thread = serve_in_thread(upstream, port)
    evil = CountingListener().start()
    config = tmp_path_factory.mktemp("ssrf") / "gw.yaml"
    config.write_text(f"upstream: http://127.0.0.1:{port}\n")
    try:
        with uvicorn_gateway(Path(config)) as (base, _pid):
            yield {"base": base, "port": int(base.rsplit(":", 1)[1]), "evil": evil,
                   "upstream": upstream}  # fmt: skip
    finally:
        evil.stop()
        stop_thread(server, thread)


def _no_framing(raw: bytes) -> bytes:
    """``raw`` without the bytes that would end the request line early."""
    return raw.replace(b" ", b"").replace(b"\r", b"").replace(b"\n", b"") or b"/"


def _evil_targets(evil: int) -> st.SearchStrategy[bytes]:
    authority = f"127.0.0.1:{evil}".encode()
    prefixes = st.sampled_from([b"*", b"*@", b"*:pw@", b"@", b"//", b"http://", b"https://",
                                b"/", b"/@", b"\\\\", b"%2F%2F", b"", b"?", b"#"])  # fmt: skip
    suffixes = st.sampled_from([b"", b"/", b"/steal", b"/x?y=1", b"@localhost/", b"#f"])
    tricky = st.tuples(prefixes, st.just(authority), suffixes).map(b"".join)
    noise = st.binary(min_size=1, max_size=40).map(_no_framing)
    return st.one_of(tricky, st.tuples(noise, st.just(authority)).map(b"".join), noise)


_METHODS = st.sampled_from([b"GET", b"POST", b"OPTIONS", b"PUT", b"DELETE", b"HEAD", b"CONNECT"])
_NAMES = st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map(str.encode)
_VALUES = st.binary(max_size=30).map(
    lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b"\x00", b"").strip()
)


_FRAMING = (b"content-length", b"transfer-encoding", b"connection", b"host")


def _request(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
             evil: int) -> bytes:  # fmt: skip
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1:" + str(evil).encode()]
    lines += [name + b": " + value for name, value in headers if name not in _FRAMING]
    if body:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _response_count(raw: bytes, method: bytes) -> int:
    """How many responses ``raw`` holds (a server-side 400 for an unparsable HEAD has a body)."""
    if method == b"HEAD":
        try:
            return len(parse_responses(raw, head_only=True))
        except (AssertionError, ValueError, IndexError):
            pass
    return len(parse_responses(raw))


def _snapshot(base: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(httpx.get(base + "/_ballast/snapshot", timeout=5).text)
    return doc


def test_no_request_reaches_another_host(world: dict[str, Any]) -> None:
    """Fuzzed request lines: one response each, 0 connections to the evil listener, nothing held."""
    evil: CountingListener = world["evil"]
    authority = f"127.0.0.1:{evil.port}".encode()

    @settings(max_examples=200, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(method=_METHODS, target=_evil_targets(evil.port),
           headers=st.lists(st.tuples(_NAMES, _VALUES), max_size=4),
           body=st.binary(max_size=64))  # fmt: skip
    @example(method=b"GET", target=b"*@" + authority + b"/steal", headers=[], body=b"")
    @example(method=b"POST", target=b"*:pw@" + authority + b"/", headers=[], body=b"x")
    @example(method=b"OPTIONS", target=b"*", headers=[], body=b"")
    def check(method: bytes, target: bytes, headers: Headers, body: bytes) -> None:
        raw = exchange(world["port"], _request(method, target, headers, body, evil.port))
        assert _response_count(raw, method) == 1, raw[:300]
        assert b"stolen" not in raw
        assert evil.accepted == 0

    check()
    snap = _snapshot(world["base"])
    assert evil.accepted == 0
    assert snap["limiter"]["inflight"] == 0
    assert snap["capacity"] is None or (
        snap["capacity"]["held"] == 0 and snap["capacity"]["buffered_bytes"] == 0
    )
    assert snap["breaker"]["state"] == "closed"
    assert all(r["breaker"] is None or r["breaker"]["state"] == "closed"
               for r in snap["routes"].values())  # fmt: skip
    assert world["upstream"].count > 0  # origin-form targets were proxied


@pytest.mark.parametrize("target", [b"*@127.0.0.1:{evil}/steal", b"*:pw@127.0.0.1:{evil}/",
                                    b"*", b"*@localhost:{evil}/"])  # fmt: skip
def test_known_ssrf_targets_get_400(world: dict[str, Any], target: bytes) -> None:
    """The reported attack targets get a 400 and never a connection to the evil listener."""
    evil: CountingListener = world["evil"]
    t = target.replace(b"{evil}", str(evil.port).encode())
    for method in (b"GET", b"OPTIONS", b"POST"):
        raw = exchange(world["port"], _request(method, t, [], b"x" if method == b"POST" else b"",
                                               evil.port))  # fmt: skip
        (response,) = parse_responses(raw)
        assert response.status == 400, raw
    assert evil.accepted == 0


def test_absolute_form_goes_to_the_configured_upstream(world: dict[str, Any]) -> None:
    """``GET http://evil/x`` is answered from the configured upstream (or refused), never evil's."""
    evil: CountingListener = world["evil"]
    before = world["upstream"].count
    t = f"http://127.0.0.1:{evil.port}/x".encode()
    (response,) = parse_responses(exchange(world["port"], _request(b"GET", t, [], b"", evil.port)))
    assert (response.status, response.body) in ((200, b"ok"), (400, response.body))
    assert evil.accepted == 0
    assert world["upstream"].count == before + (response.status == 200)
