"""The composed gateway in-process: proxying, shedding, admin, snapshot, reload."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ballast_asgi.config import load_config
from ballast_asgi.core.forwarded import CLIENT_IP_KEY
from ballast_asgi.gateway import Gateway, build_gateway
from tests.fakes import EchoHandler

pytestmark = pytest.mark.anyio


def _gateway(up: EchoHandler, tmp_path: Path | None = None, text: str = "") -> Gateway:
    if tmp_path is None:
        config = load_config(env={"BALLAST_UPSTREAM": "http://up.test"})
        return build_gateway(config, transport=httpx.MockTransport(up), env={})
    path = tmp_path / "ballast.yaml"
    path.write_text("upstream: http://up.test\n" + text)
    config = load_config(env={}, path=path)
    return build_gateway(config, transport=httpx.MockTransport(up), config_path=path, env={})


def _client(gw: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(gw), base_url="http://gw")


async def test_proxies_through_every_stage() -> None:
    """A request goes through all stages to the upstream with its deadline reduced."""
    up = EchoHandler()
    gw = _gateway(up)
    async with _client(gw) as c:
        r = await c.get("/orders/1", headers={"X-Priority": "critical", "X-Deadline-Ms": "400"})
    assert r.status_code == 200
    assert r.json()["path"] == "/orders/1"
    assert 0 < int(r.json()["deadline"]) <= 400
    assert gw.parts.limiter.inflight == 0


async def test_dead_on_arrival_never_reaches_upstream() -> None:
    """X-Deadline-Ms <= 0 is shed with the pinned headers and no upstream call."""
    up = EchoHandler()
    async with _client(_gateway(up)) as c:
        r = await c.get("/x", headers={"X-Deadline-Ms": "0"})
    assert r.status_code == 429
    assert r.headers["x-ballast-reason"] == "deadline"
    assert int(r.headers["retry-after"]) >= 1
    assert up.calls == 0


@pytest.mark.parametrize(("header", "value"), [("X-Priority", "urgent"), ("X-Deadline-Ms", "soon")])
async def test_malformed_headers_get_400_naming_the_header(header: str, value: str) -> None:
    """Malformed tier or deadline: 400 whose message names the header."""
    up = EchoHandler()
    async with _client(_gateway(up)) as c:
        r = await c.get("/x", headers={header: value})
    assert r.status_code == 400
    assert header in r.json()["message"]
    assert up.calls == 0


async def test_metrics_and_snapshot_are_served_not_proxied() -> None:
    """Admin paths answer locally with parseable metrics and a full snapshot."""
    up = EchoHandler()
    gw = _gateway(up)
    async with _client(gw) as c:
        await c.get("/x", headers={"X-Deadline-Ms": "-1", "X-Priority": "bulk"})
        text = (await c.get("/_ballast/metrics")).text
        snap = (await c.get("/_ballast/snapshot")).json()
        health = await c.get("/_ballast/health")
    assert up.calls == 0 and health.status_code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    key = ("ballast_shed_total", (("priority", "bulk"), ("reason", "deadline")))
    assert samples[key] == 1.0
    assert ("ballast_concurrency_limit", ()) in samples
    assert ("ballast_inflight_requests", ()) in samples
    assert set(snap) >= {"limiter", "queue", "breaker", "retry_budget", "config", "shed"}
    assert snap["shed"] == {"deadline": {"bulk": 1.0}}
    assert snap["config"]["version"] == 1


async def test_admin_port_app_serves_root_paths() -> None:
    """The admin-port app serves /metrics and /snapshot at its root."""
    gw = _gateway(EchoHandler())
    transport = httpx.ASGITransport(gw.admin_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://admin") as c:
        assert (await c.get("/metrics")).status_code == 200
        snap = (await c.get("/snapshot")).json()
    assert snap["limiter"]["inflight"] == 0
    from ballast_asgi.core import native  # which build runs, and why not (ADR 0021)

    assert snap["native"] == native.status()
    assert snap["native"]["compiled"] is native.active()
    assert (snap["native"]["why_not"] is None) is native.active()


async def test_reload_applies_new_limit_and_rejects_invalid(tmp_path: Path) -> None:
    """A valid new file is applied (version bumps); an invalid one is refused, old stays."""
    gw = _gateway(EchoHandler(), tmp_path, "limiter:\n  algorithm: fixed\n  fixed_limit: 8\n")
    assert gw.parts.limiter.limit == 8
    path = tmp_path / "ballast.yaml"
    path.write_text("upstream: http://up.test\nlimiter:\n  algorithm: fixed\n  fixed_limit: 32\n")
    ok, message = await gw.reload()
    assert ok, message
    assert gw.parts.limiter.limit == 32
    assert gw.snapshot()["config"]["version"] == 2
    path.write_text("upstream: http://up.test\nadmission_queue:\n  max_queue_size: 0\n")
    ok, message = await gw.reload()
    assert not ok and "admission_queue.max_queue_size" in message
    assert gw.parts.limiter.limit == 32 and gw.version == 2


async def test_reload_endpoint_requires_token(tmp_path: Path) -> None:
    """POST /_ballast/reload works only with the configured bearer token."""
    gw = _gateway(EchoHandler(), tmp_path, "admin:\n  token: t0k\n")
    async with _client(gw) as c:
        assert (await c.post("/_ballast/reload")).status_code == 401
        r = await c.post("/_ballast/reload", headers={"Authorization": "Bearer t0k"})
    assert r.status_code == 200 and r.json()["reloaded"] is True


async def test_missing_upstream_is_a_config_error() -> None:
    """Building the gateway without an upstream fails with a named error."""
    from ballast_asgi.config import build_config
    from ballast_asgi.core.errors import ConfigError

    config = build_config({}, require_upstream=False)
    with pytest.raises(ConfigError, match="BALLAST_UPSTREAM"):
        build_gateway(config)


async def test_configured_retry_statuses_are_retried(tmp_path: Path) -> None:
    """With retry.retry_statuses [500], a GET answered 500 once is retried and succeeds."""
    answers = [500, 200]
    calls: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(answers.pop(0))

    path = tmp_path / "ballast.yaml"
    path.write_text(
        "upstream: http://up.test\nretry:\n  retry_statuses: [500]\n  backoff_base_ms: 0\n"
    )
    config = load_config(env={}, path=path)
    gw = build_gateway(config, transport=httpx.MockTransport(flaky), config_path=path, env={})
    async with _client(gw) as c:
        r = await c.get("/flaky")
    assert r.status_code == 200 and calls == ["/flaky", "/flaky"]


class _Recorder:
    """An ASGI app that keeps the scopes it is called with."""

    def __init__(self) -> None:
        self.scopes: list[dict[str, object]] = []

    async def __call__(self, scope: dict[str, object], receive: object, send: object) -> None:
        self.scopes.append(scope)


def _scope(client: str, forwarded: bytes) -> dict[str, object]:
    return {
        "type": "http", "method": "GET", "path": "/x", "root_path": "", "client": (client, 5000),
        "headers": [(b"host", b"gw"), (b"x-forwarded-for", forwarded)],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("trusted", "may_rewrite", "client", "expected"),
    [
        ([], False, "10.0.0.1", "same"),  # nothing reads X-Forwarded-For: the scope as it is
        ([], True, "203.0.113.7", None),  # the server took the client from the header
        ([], True, "10.0.0.1", "same"),
        (["10.0.0.0/8"], False, "10.0.0.1", "203.0.113.7"),  # a trusted proxy's client
        (["10.0.0.0/8"], False, "192.0.2.1", "same"),  # an untrusted peer's header is ignored
    ],
)
async def test_the_pass_through_gets_the_peer_decided_scope(
    trusted: list[str], may_rewrite: bool, client: str, expected: str | None
) -> None:
    """``Gateway.__call__`` decides the peer (``_peer``) only when something reads it."""
    env = {"BALLAST_UPSTREAM": "http://up.test"}
    config = load_config(env=env, overrides={"proxy": {"trusted_proxies": trusted}})
    gw = build_gateway(config, transport=httpx.MockTransport(EchoHandler()), env={})
    gw.server_may_rewrite = may_rewrite
    recorder = _Recorder()
    gw.stack = dataclasses.replace(gw.stack, direct=recorder)
    scope = _scope(client, b"203.0.113.7")
    await gw(scope, _never, _never)
    (seen,) = recorder.scopes
    if expected == "same":
        assert seen is scope
    elif expected is None:
        assert seen["client"] is None
    else:
        assert seen[CLIENT_IP_KEY] == expected and seen["client"] == (client, 5000)


async def _never(*_: object) -> None:
    raise AssertionError("not called")
