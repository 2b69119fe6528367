"""Priority classification: trusted header, consumers, rules, default; no forging."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ballast_asgi.config import PriorityConfig
from ballast_asgi.core.classify import Classifier
from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.priority import Priority
from ballast_asgi.middleware.admission import AdmissionMiddleware
from ballast_asgi.middleware.context import get_context
from ballast_asgi.middleware.responses import ShedResponder, send_json
from ballast_asgi.telemetry.metrics import null_metrics

C, S, B = Priority.CRITICAL, Priority.STANDARD, Priority.BULK

PRODUCTION: dict[str, Any] = {
    "trust_header": False,
    "trusted_networks": ["10.0.0.0/8", "fd00::/8", "192.168.1.7"],
    "default": "standard",
    "rules": [
        {"path": "/checkout/*", "methods": ["post"], "priority": "critical"},
        {"path": "/batch/*", "priority": "bulk"},
        {"path": "/reports/????", "methods": ["GET", "HEAD"], "priority": "bulk"},
    ],
    "consumers": {"header": "X-Api-Key", "keys": {"gold": "critical", "etl": "bulk"}},
}


def _clf(**overrides: Any) -> Classifier:
    return Classifier(PriorityConfig.model_validate({**PRODUCTION, **overrides}))


def _h(**headers: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]


def _prio(value: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-priority", value.encode())]


@pytest.mark.parametrize("host", ["203.0.113.9", "2001:db8::1", "11.0.0.1", None, "testclient"])
def test_forged_header_from_untrusted_peer_is_ignored(host: str | None) -> None:
    """X-Priority: 0 from outside the trusted networks does not promote the request."""
    assert _clf().classify("GET", "/home", _prio("0"), host) == (S, True)


@pytest.mark.parametrize(
    "host", ["10.1.2.3", "10.255.255.255", "fd00::1", "fdff:1::2", "::ffff:10.9.9.9", "192.168.1.7"]
)
def test_header_from_trusted_network_is_honoured(host: str) -> None:
    """X-Priority from a trusted IPv4, IPv6 or IPv4-mapped peer sets the tier."""
    assert _clf().classify("GET", "/home", _prio("critical"), host) == (C, False)


def test_ipv6_zone_id_is_stripped() -> None:
    """A link-local peer with a zone id still parses as an address."""
    clf = _clf(trusted_networks=["fe80::/10"])
    assert clf.classify("GET", "/", _prio("bulk"), "fe80::1%eth0") == (B, False)


def test_trust_header_true_trusts_everyone() -> None:
    """The demo setting honours the header from any peer, even with no address."""
    clf = _clf(trust_header=True, trusted_networks=[])
    assert clf.classify("GET", "/", _prio("2"), None) == (B, False)
    assert clf.classify("GET", "/", _prio("2"), "203.0.113.9") == (B, False)


def test_trusted_header_wins_over_consumer_and_rule() -> None:
    """A trusted caller's X-Priority overrides both consumer keys and rules."""
    headers = [*_prio("bulk"), (b"x-api-key", b"gold")]
    assert _clf().classify("POST", "/checkout/pay", headers, "10.0.0.1") == (B, False)


def test_untrusted_header_falls_through_to_consumer_then_rule() -> None:
    """An ignored header leaves the decision to the consumer key, then the rules."""
    clf = _clf()
    with_key = [*_prio("critical"), (b"x-api-key", b"etl")]
    assert clf.classify("POST", "/checkout/x", with_key, "1.2.3.4") == (B, True)
    assert clf.classify("POST", "/batch/x", _prio("critical"), "1.2.3.4") == (B, True)


@pytest.mark.parametrize("value", ["urgent", "3", "", "-1", "0x0", "crit ical"])
def test_malformed_header_from_trusted_peer_raises(value: str) -> None:
    """A garbled trusted value is a HeaderError naming X-Priority (answered 400)."""
    with pytest.raises(HeaderError) as info:
        _clf().classify("GET", "/", _prio(value), "10.0.0.1")
    assert info.value.header == "X-Priority"


@pytest.mark.parametrize("value", ["urgent", "3", "", "\xff"])
def test_malformed_header_from_untrusted_peer_is_ignored(value: str) -> None:
    """An untrusted header is not validated: an outsider cannot provoke a 400."""
    headers = [(b"x-priority", value.encode("latin-1"))]
    assert _clf().classify("GET", "/", headers, "8.8.8.8") == (S, True)


def test_disagreeing_duplicate_headers_from_trusted_peer_raise() -> None:
    """Two trusted X-Priority values that disagree are rejected, not guessed."""
    with pytest.raises(HeaderError):
        _clf().classify("GET", "/", [*_prio("0"), *_prio("2")], "10.0.0.1")
    same = [*_prio("0"), *_prio("CRITICAL")]
    assert _clf().classify("GET", "/", same, "10.0.0.1") == (C, False)


def test_consumer_key_maps_to_tier() -> None:
    """The configured API-key header (case-insensitive name) picks the tier."""
    clf = _clf()
    assert clf.classify("GET", "/x", [(b"x-api-key", b"gold")], None) == (C, False)
    assert clf.classify("GET", "/x", [(b"x-api-key", b"etl")], None) == (B, False)


def test_unknown_consumer_key_falls_through_to_rules() -> None:
    """A key that is not configured is treated as no key at all."""
    headers = [(b"x-api-key", b"stolen?")]
    assert _clf().classify("GET", "/batch/1", headers, None) == (B, False)
    assert _clf().classify("GET", "/home", headers, None) == (S, False)


def test_consumer_wins_over_rules() -> None:
    """A consumer mapping is more specific than a path rule."""
    headers = [(b"x-api-key", b"etl")]
    assert _clf().classify("POST", "/checkout/pay", headers, None) == (B, False)


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("POST", "/checkout/pay", C),
        ("post", "/checkout/pay", C),
        ("GET", "/checkout/pay", S),
        ("POST", "/checkout", S),
        ("POST", "/checkout/a/b", C),
        ("PUT", "/batch/job", B),
        ("GET", "/batch/", B),
        ("GET", "/Batch/job", S),
        ("GET", "/reports/2024", B),
        ("HEAD", "/reports/2024", B),
        ("GET", "/reports/20245", S),
        ("DELETE", "/reports/2024", S),
    ],
)
def test_rules_match_method_and_path(method: str, path: str, expected: Priority) -> None:
    """Rules match by method set (empty = any) and fnmatch path, first rule wins."""
    assert _clf().classify(method, path, [], "1.2.3.4") == (expected, False)


def test_first_matching_rule_wins() -> None:
    """Rules are tried in file order."""
    rules = [{"path": "/a/*", "priority": "bulk"}, {"path": "/a/b", "priority": "critical"}]
    assert _clf(rules=rules).classify("GET", "/a/b", [], None) == (B, False)


def test_default_when_nothing_matches() -> None:
    """No header, key or rule: the configured default tier."""
    clf = Classifier(PriorityConfig.model_validate({"default": "bulk"}))
    assert clf.classify("GET", "/anything", [(b"accept", b"*/*")], None) == (B, False)


def test_classify_scope_reads_asgi_fields() -> None:
    """classify_scope takes method, path, headers and client from a scope."""
    scope = {"method": "GET", "path": "/", "headers": _prio("0"), "client": ("10.3.3.3", 5)}
    assert _clf().classify_scope(scope) == (C, False)
    assert _clf().classify_scope({**scope, "client": None}) == (S, True)


def test_is_trusted_rejects_garbage_hosts() -> None:
    """Unparsable peer names are never trusted."""
    clf = _clf()
    assert not clf.is_trusted("not-an-ip")
    assert not clf.is_trusted("")
    assert not clf.is_trusted(None)
    assert not _clf(trusted_networks=[]).is_trusted("10.0.0.1")


@given(
    value=st.binary(max_size=12),
    octets=st.tuples(*[st.integers(0, 255)] * 4),
)
def test_untrusted_peer_never_changes_tier_or_raises(
    value: bytes, octets: tuple[int, int, int, int]
) -> None:
    """Whatever an outsider sends as X-Priority, the result equals sending nothing."""
    assume(octets[0] != 10)
    host = ".".join(map(str, octets))
    clf = _clf(trusted_networks=["10.0.0.0/8"])
    got = clf.classify("GET", "/batch/x", [(b"x-priority", value)], host)
    assert got == (clf.classify("GET", "/batch/x", [], host)[0], True)


@given(token=st.sampled_from(["0", "1", "2", "critical", "Standard", " BULK "]))
def test_trusted_tokens_parse(token: str) -> None:
    """Every documented token is accepted from a trusted peer."""
    tier, ignored = _clf().classify("GET", "/", _prio(token), "10.0.0.1")
    assert not ignored and tier.label == {"0": "critical", "1": "standard", "2": "bulk"}.get(
        token, token.strip().lower()
    )


@pytest.mark.anyio
async def test_forged_priority_through_admission_middleware() -> None:
    """Wired into AdmissionMiddleware, a forged X-Priority from outside stays standard."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send_json(send, 200, {"tier": get_context(scope).priority.label})

    metrics = null_metrics()
    mw = AdmissionMiddleware(
        app, responder=ShedResponder(metrics), metrics=metrics, classifier=_clf()
    )
    headers = {"x-priority": "critical"}
    for peer, tier in [("203.0.113.1", "standard"), ("10.4.4.4", "critical")]:
        transport = httpx.ASGITransport(app=mw, client=(peer, 4321))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            response = await client.get("/home", headers=headers)
        assert response.json() == {"tier": tier}
    assert metrics.registry.get_sample_value("ballast_priority_header_ignored_total") == 1.0


_NAMES = [b"x-priority", b"x-api-key", b"host", b"accept", b"x-other"]
_VALUES = [b"0", b"1", b"critical", b" bulk ", b"gold", b"etl", b"junk", b""]


@given(
    headers=st.lists(st.tuples(st.sampled_from(_NAMES), st.sampled_from(_VALUES)), max_size=6),
    host=st.sampled_from(["10.0.0.1", "203.0.113.9", None]),
    path=st.sampled_from(["/", "/batch/x", "/checkout/c"]),
)
def test_classify_head_decides_as_classify(
    headers: list[tuple[bytes, bytes]], host: str | None, path: str
) -> None:
    """From the head read once (``read_head`` with the key header), the same tier or error."""
    from ballast_asgi.core.head import HeadLimits, read_head

    assume(sum(1 for name, _ in headers if name == b"host") <= 1)  # two Hosts: 400 at read
    clf = _clf()
    head = read_head(headers, HeadLimits(), "POST", clf.key_header)
    results = []
    for decide in (
        lambda: clf.classify("POST", path, headers, host),
        lambda: clf.classify_head("POST", path, head, host),
    ):
        try:
            results.append(decide())
        except HeaderError as exc:
            results.append((exc.header, exc.status))
    assert results[0] == results[1]
