"""State changes are logged once (events.py) and a lost dependency makes health ``degraded``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from ballast_asgi.canary.core.judges import SequentialJudge
from ballast_asgi.canary.core.rollout import Rollout
from ballast_asgi.canary.log import announce
from ballast_asgi.config import build_config
from ballast_asgi.discovery import follower as follower_mod
from ballast_asgi.discovery.core.model import ConfigVersion, Instance, Keys
from ballast_asgi.discovery.etcd import EtcdUnavailable, KeyValue
from ballast_asgi.discovery.follower import Follower
from ballast_asgi.gateway import TRUST_EVENT, build_gateway, warn_header_trust
from ballast_asgi.telemetry.events import LOGGER, events
from tests.e2e.support import free_port
from tests.fakes import FakeClock


@pytest.fixture
def seen(caplog: pytest.LogCaptureFixture) -> Iterator[list[tuple[str, str, dict[str, Any]]]]:
    """The events logged during the test: (event, level, fields)."""
    log = logging.getLogger(LOGGER)
    saved = (log.propagate, log.level, list(log.handlers))
    log.propagate, log.handlers = True, []
    log.setLevel(logging.INFO)
    events.reset()
    caplog.set_level(logging.INFO, logger=LOGGER)
    out: list[tuple[str, str, dict[str, Any]]] = []
    yield out
    out.extend((r.ballast_event, r.levelname.lower(), r.ballast_fields)  # type: ignore[attr-defined]
               for r in caplog.records if hasattr(r, "ballast_event"))  # fmt: skip
    log.propagate, log.level, log.handlers = saved[0], saved[1], saved[2]


def _names(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.ballast_event for r in caplog.records if hasattr(r, "ballast_event")]  # type: ignore[attr-defined]


class _Etcd:
    """A fake etcd: refuses once, then serves one version twice; every watch breaks."""

    endpoint = "127.0.0.1:2379"

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop
        self.gets = 0
        version = ConfigVersion(3, (Instance("http://127.0.0.1:9001"),))
        self.kv = KeyValue(b"k", version.encode(), 5)

    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        self.gets += 1
        if self.gets == 1:
            raise EtcdUnavailable("connection refused")
        if self.gets == 3:
            self.stop.set()
        return self.kv, 5

    async def watch(self, key: bytes, *, prefix: bool, start_revision: int) -> Any:
        raise EtcdUnavailable("stream reset")
        yield  # pragma: no cover - an async generator that fails at once


@pytest.mark.anyio
async def test_etcd_unreachable_back_lost_and_version_applied_are_logged(
    seen: list[Any], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The follower logs unreachable, back, the version applied and lost: once each."""

    async def no_wait(events: list[asyncio.Event], timeout_s: float | None) -> None:
        await asyncio.sleep(0)  # the back-off's length is not what is tested

    monkeypatch.setattr(follower_mod, "wait_any", no_wait)
    stop = asyncio.Event()
    follower = Follower(_Etcd(stop), Keys("shop"), lambda v: None)  # type: ignore[arg-type]
    await follower.run(stop)
    assert _names(caplog) == ["discovery.etcd_unreachable", "discovery.etcd_back",
                              "discovery.version_applied", "discovery.etcd_lost",
                              "discovery.etcd_back", "discovery.etcd_lost"]  # fmt: skip
    applied = next(r for r in caplog.records if r.getMessage().startswith("discovery.version"))
    assert applied.ballast_fields == {"service": "shop", "config_version": 3, "instances": 1}  # type: ignore[attr-defined]


@pytest.mark.anyio
async def test_redis_unreachable_at_start_up_is_logged_and_health_degraded(
    seen: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A redis_url nobody answers: an error line at start-up and health ``degraded``."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    gw = build_gateway(build_config({"upstream": "http://127.0.0.1:9", "rate_limit": {
        "enabled": True, "mode": "redis", "redis_url": url}}))  # fmt: skip
    assert gw.health() == (200, {"status": "ok"})
    limiter = gw.parts.ratelimit.limiter  # type: ignore[union-attr]
    await limiter.start()
    try:
        status, body = gw.health()
    finally:
        await limiter.close()
    assert status == 200 and body["status"] == "degraded"
    assert body["reasons"] == [f"rate_limit: Redis {url} unreachable; deciding on the local share"]
    (record,) = [r for r in caplog.records if getattr(r, "ballast_event", "").startswith("rate")]
    assert record.ballast_event == "ratelimit.redis_unreachable"  # type: ignore[attr-defined]
    assert record.levelname == "ERROR" and record.ballast_fields["redis"] == url  # type: ignore[attr-defined]


def test_breaker_transitions_are_logged(seen: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    """The gateway breaker opening, half-opening and closing: one line each; open is degraded."""
    clock = FakeClock(0.0)
    gw = build_gateway(build_config({"upstream": "http://127.0.0.1:9"}), clock=clock)
    breaker = gw.parts.breaker
    while breaker.state(clock()).value == "closed":  # an outage: not client-specific
        ticket = breaker.acquire(clock())
        assert ticket is not None
        ticket.record(False, clock(), shared=True)
    assert gw.health()[1]["reasons"][0].startswith("breaker: open")
    clock.advance(60.0)
    probe = breaker.acquire(clock())
    assert probe is not None
    probe.record(True, clock())
    while breaker.state(clock()).value != "closed":
        probe = breaker.acquire(clock())
        assert probe is not None
        probe.record(True, clock())
    assert _names(caplog) == ["breaker.open", "breaker.half_open", "breaker.closed"]


def test_canary_rollback_is_logged(seen: list[Any], caplog: pytest.LogCaptureFixture) -> None:
    """A canary rolled back logs a warning naming the reason."""
    rollout = Rollout(SequentialJudge(), now=0.0)
    rollout.rollback(1.0)
    announce(rollout)
    (record,) = caplog.records
    assert record.ballast_event == "canary.rolled_back" and record.levelname == "WARNING"  # type: ignore[attr-defined]
    fields = record.ballast_fields  # type: ignore[attr-defined]
    assert fields["reason"] == "operator" and fields["alpha"] == 0.01
    assert {"errors_log_e_value", "errors_log_bound", "latency_log_e_value"} <= set(fields)


def test_trusting_every_client_is_said_once_at_start_up(
    seen: list[object], caplog: pytest.LogCaptureFixture
) -> None:
    """The default priority.trust_header: true writes a start-up warning; false writes none."""
    assert warn_header_trust(build_config({"upstream": "http://127.0.0.1:9"}))
    assert not warn_header_trust(build_config({
        "upstream": "http://127.0.0.1:9",
        "priority": {"trust_header": False, "trusted_networks": ["10.0.0.0/8"]},
    }))  # fmt: skip
    records = [r for r in caplog.records if getattr(r, "ballast_event", None) == TRUST_EVENT]
    assert len(records) == 1 and records[0].levelname == "WARNING"
    assert "priority.trust_header: false" in records[0].getMessage()
