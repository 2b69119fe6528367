"""The rate-limit stage in the stack (local mode, fake clock) and its config section."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ballast_asgi.config import build_config, load_config
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.forwarded import CLIENT_IP_KEY
from ballast_asgi.gateway.stack import build_parts, build_stack
from ballast_asgi.ratelimit.core.gcra import Limits
from ballast_asgi.ratelimit.core.keys import MAX_KEY_CHARS, KeyResolver, Route
from ballast_asgi.telemetry.metrics import null_metrics
from tests.fakes import FakeClock, StatusUpstream

pytestmark = pytest.mark.anyio


def _stack(section: dict[str, Any], **extra: Any) -> tuple[httpx.AsyncClient, StatusUpstream, Any]:
    config = build_config({"rate_limit": {"enabled": True, **section}, **extra},
                          require_upstream=False)  # fmt: skip
    clock = FakeClock(100.0)
    parts = build_parts(config, null_metrics(), clock=clock)
    inner = StatusUpstream()
    app = build_stack(inner, parts, config, retries=False)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw")
    return client, inner, (clock, parts)


async def test_over_the_limit_is_shed_with_headers_and_never_reaches_the_app() -> None:
    """The burst passes; the next request gets 429 rate_limited with Retry-After and RateLimit."""
    client, inner, (_, parts) = _stack({"rate_per_s": 2, "burst": 3, "key": "header:X-Tenant"})
    async with client:
        codes = [(await client.get("/", headers={"x-tenant": "t1"})).status_code for _ in range(3)]
        shed = await client.get("/", headers={"x-tenant": "t1"})
        other = await client.get("/", headers={"x-tenant": "t2"})
    assert codes == [200, 200, 200] and other.status_code == 200
    assert shed.status_code == 429 and inner.calls == 4
    assert shed.headers["x-ballast-reason"] == "rate_limited"
    assert shed.headers["retry-after"] == "1"
    assert shed.headers["ratelimit-policy"] == '"default";q=2;w=1'
    assert shed.headers["ratelimit"] == '"default";r=0;t=1'
    assert parts.metrics.shed.labels("rate_limited", "standard")._value.get() == 1


async def test_bucket_refills_with_time() -> None:
    """After the refill time a denied key is admitted again."""
    client, _, (clock, _) = _stack({"rate_per_s": 1, "burst": 1})
    async with client:
        assert (await client.get("/")).status_code == 200
        assert (await client.get("/")).status_code == 429
        clock.now += 1.0
        assert (await client.get("/")).status_code == 200


async def test_retry_after_follows_a_slow_refill() -> None:
    """At 0.2 requests/s the refill takes 5 s, and Retry-After says so."""
    client, _, _ = _stack({"rate_per_s": 0.2, "burst": 1})
    async with client:
        await client.get("/")
        shed = await client.get("/")
    assert shed.headers["retry-after"] == "5"
    assert shed.headers["ratelimit-policy"] == '"default";q=1;w=5'


async def test_dry_run_counts_but_admits() -> None:
    """In dry-run the over-limit request is counted as would-shed and served."""
    client, inner, (_, parts) = _stack({"rate_per_s": 1, "burst": 1}, load_shed_dry_run=True)
    async with client:
        codes = [(await client.get("/")).status_code for _ in range(3)]
    assert codes == [200, 200, 200] and inner.calls == 3
    assert parts.metrics.dry_run_shed.labels("rate_limited", "standard")._value.get() == 2


async def test_route_rule_has_its_own_bucket_and_name() -> None:
    """A route with its own limit is shed under its name while the default still admits."""
    routes = [{"name": "search", "path": "/search*", "rate_per_s": 1, "burst": 1}]
    client, _, _ = _stack({"rate_per_s": 100, "burst": 10, "routes": routes})
    async with client:
        assert (await client.get("/search?q=1")).status_code == 200
        shed = await client.get("/search/x")
        assert (await client.get("/home")).status_code == 200
    assert shed.status_code == 429 and shed.headers["ratelimit-policy"].startswith('"search"')


async def test_snapshot_and_metrics_show_the_limiter() -> None:
    """/snapshot has the rate-limit state; metrics count decisions by mode and source."""
    client, _, (clock, parts) = _stack({"rate_per_s": 1, "burst": 1})
    async with client:
        await client.get("/")
        await client.get("/")
    snap = parts.snapshot(clock.now)["rate_limit"]
    assert snap["mode"] == "local" and snap["decisions"] == {"allowed/local": 1, "denied/local": 1}
    text = parts.metrics.exposition().decode()
    assert (
        'ballast_ratelimit_decisions_total{mode="local",outcome="denied",source="local"} 1.0'
        in text
    )
    # Both requests' decision waits are recorded (local mode never waits: the first bucket).
    assert sum(snap["decision_wait"]["buckets_s"].values()) == 2
    assert 0.0 <= snap["decision_wait"]["max_ms"] < 1000.0
    assert "ballast_ratelimit_decision_wait_seconds_count 2.0" in text


def test_resolver_keys() -> None:
    """client_ip is the gateway's originating client (else the peer); long keys are hashed."""
    limits = Limits(10, 1)
    r = KeyResolver("client_ip", limits)
    xff = [(b"x-forwarded-for", b"6.6.6.6")]
    decided = {"client": ("10.0.0.1", 1), "headers": xff, CLIENT_IP_KEY: "203.0.113.9"}
    assert r.resolve(decided)[0] == "default|203.0.113.9"
    assert r.resolve({"client": ("198.51.100.1", 1), "headers": xff})[0] == "default|198.51.100.1"
    c = KeyResolver("consumer", limits, consumer_header="x-api-key")
    assert c.resolve({"headers": [(b"x-api-key", b"k1")]})[0] == "default|k1"
    assert c.resolve({"headers": []})[0] == "default|-"
    h = KeyResolver("header:X-Tenant", limits, overrides={"big": Limits(99, 9, "override")})
    long_key, _ = h.resolve({"headers": [(b"x-tenant", b"a" * 10_000)]})
    assert len(long_key) <= len("default|") + MAX_KEY_CHARS
    assert h.resolve({"headers": [(b"x-tenant", b"big")]})[1].rate_per_s == 99
    route = KeyResolver("route", limits, routes=[Route("api", "/api/*", ("POST",))])
    assert route.resolve({"method": "POST", "path": "/api/x"})[0] == "api|-"
    assert route.resolve({"method": "GET", "path": "/api/x"})[0] == "default|-"
    with pytest.raises(ValueError, match="header:NAME"):
        KeyResolver("cookie", limits)


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ({"mode": "fast"}, "rate_limit.mode"),
        ({"key": "header:"}, "rate_limit.key"),
        ({"rate_per_s": 0}, "rate_limit.rate_per_s"),
        ({"burst": 0}, "rate_limit.burst"),
        ({"redis_url": "http://x"}, "rate_limit.redis_url"),
        ({"routes": [{"name": "a b"}]}, "rate_limit.routes.0.name"),
        ({"lease": {"max_tokens": 0}}, "rate_limit.lease.max_tokens"),
        ({"breaker": {"kind": "magic"}}, "rate_limit.breaker.kind"),
        ({"colour": 1}, "rate_limit.colour"),
    ],
)
def test_bad_config_names_the_field(section: dict[str, Any], field: str) -> None:
    """Every invalid rate_limit value is a ConfigError naming its key path."""
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        build_config({"rate_limit": section}, require_upstream=False)


def test_env_redis_url_overrides_the_file() -> None:
    """BALLAST_REDIS_URL wins over rate_limit.redis_url."""
    cfg = load_config(env={"BALLAST_UPSTREAM": "http://u:1", "BALLAST_REDIS_URL": "redis://r:7/2"})
    assert cfg.rate_limit.redis_url == "redis://r:7/2"


async def test_admitted_responses_carry_the_ratelimit_headers_unless_refused_only() -> None:
    """By default a 200 says how much is left; ``headers: refused`` keeps them on 429s only."""
    client, _, _ = _stack({"rate_per_s": 2, "burst": 3})
    async with client:
        first = await client.get("/")
        second = await client.get("/")
    assert first.headers["ratelimit-policy"] == '"default";q=2;w=1'
    assert first.headers["ratelimit"] == '"default";r=2;t=1'
    assert second.headers["ratelimit"] == '"default";r=1;t=1'
    client, _, _ = _stack({"rate_per_s": 2, "burst": 1, "headers": "refused"})
    async with client:
        ok = await client.get("/")
        shed = await client.get("/")
    assert "ratelimit" not in ok.headers and "ratelimit-policy" not in ok.headers
    assert shed.status_code == 429 and shed.headers["ratelimit"] == '"default";r=0;t=1'
