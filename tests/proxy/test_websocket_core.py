"""The pure websocket limits: the per-connection pace, the per-client cap, the relay limits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from uvicorn.config import Config
from uvicorn.protocols.websockets.auto import AutoWebSocketsProtocol

from ballast_asgi.config import build_config, load_config
from ballast_asgi.config.models import ServerConfig, WebSocketConfig
from ballast_asgi.core.connections import ConnectionCap
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.websocket import Pace, RelayLimits
from ballast_asgi.gateway import build_gateway
from ballast_asgi.proxy.websocket import relay_limits
from ballast_asgi.server.serve import adopt_uvicorn, uvicorn_settings
from ballast_asgi.server.ws import PacedWebSocketProtocol


def test_pace_lets_one_second_of_burst_through_at_once() -> None:
    """At 100 messages/s, 100 tiny messages at one instant pass without a wait; the 101st waits."""
    pace = Pace(100, 1_000_000, now=0.0)
    assert [pace.take(1, 0.0) for _ in range(100)] == [0.0] * 100
    assert pace.take(1, 0.0) == pytest.approx(0.01)


def test_pace_refills_at_its_rate() -> None:
    """After the burst, one message per 1/rate seconds passes without a wait."""
    pace = Pace(10, 1_000_000, now=0.0)
    for _ in range(10):
        pace.take(1, 0.0)
    assert pace.take(1, 0.1) == 0.0
    assert pace.take(1, 0.1) == pytest.approx(0.1)


def test_a_message_larger_than_the_byte_bucket_passes_once_then_waits() -> None:
    """A 3 MiB message at 1 MiB/s goes through, and the next read waits 2 s (the debt)."""
    mib = 1024 * 1024
    pace = Pace(1000, mib, now=0.0)
    assert pace.take(3 * mib, 0.0) == pytest.approx(2.0)
    assert pace.take(0, 2.0) == 0.0


@given(
    rate=st.integers(1, 500),
    gaps=st.lists(st.floats(0.0, 0.05), min_size=1, max_size=400),
)
def test_a_reader_that_honours_the_waits_never_beats_rate_plus_burst(
    rate: int, gaps: list[float]
) -> None:
    """Whatever the arrival gaps, messages forwarded by time t stay within rate * t + rate."""
    pace = Pace(rate, 1e12, now=0.0)
    now = 0.0
    for count, gap in enumerate(gaps, start=1):
        now += gap + pace.take(1, now)  # the reader waits, then reads the next one
        assert count <= rate * now + rate + 1


def test_pace_refuses_rates_that_are_not_positive() -> None:
    """A zero rate is a ValueError naming both rates."""
    with pytest.raises(ValueError, match="messages/s"):
        Pace(0, 1, now=0.0)


def test_per_client_cap_bounds_one_address_and_not_the_others() -> None:
    """With 2 per client, a third slot for the same address is refused; another address gets one."""
    cap = ConnectionCap(10, 0.0, max_per_client=2)
    assert cap.try_acquire(Priority.BULK, "10.0.0.1")
    assert cap.try_acquire(Priority.CRITICAL, "10.0.0.1")
    assert not cap.try_acquire(Priority.CRITICAL, "10.0.0.1")
    assert cap.client_full("10.0.0.1") and not cap.client_full("10.0.0.2")
    assert cap.try_acquire(Priority.STANDARD, "10.0.0.2")
    assert cap.snapshot()["busiest_client"] == 2 and cap.open == 3


def test_per_client_counts_go_back_and_empty_keys_are_dropped() -> None:
    """Releasing every slot of a client leaves no key behind; a release too many raises."""
    cap = ConnectionCap(10, max_per_client=1)
    assert cap.try_acquire(Priority.STANDARD, None)
    assert not cap.try_acquire(Priority.STANDARD, None)  # no address: one shared key
    cap.release(None)
    assert cap.by_client == {} and cap.open == 0
    with pytest.raises(RuntimeError):
        cap.release("10.0.0.9")


def test_cap_without_per_client_limit_counts_only_the_tiers() -> None:
    """max_per_client None: one address may take every shared slot (the old behaviour)."""
    cap = ConnectionCap(3, 0.0)
    assert all(cap.try_acquire(Priority.STANDARD, "10.0.0.1") for _ in range(3))
    assert not cap.try_acquire(Priority.CRITICAL, "10.0.0.2")


def test_per_client_cap_must_be_positive() -> None:
    """max_per_client 0 is a ValueError naming it."""
    with pytest.raises(ValueError, match="max_per_client"):
        ConnectionCap(3, max_per_client=0)


def test_relay_limits_refuse_non_positive_values_naming_the_key() -> None:
    """A zero timeout is a ValueError naming websocket.send_timeout_ms."""
    with pytest.raises(ValueError, match=r"websocket\.send_timeout_ms"):
        RelayLimits(send_timeout_ms=0)


def test_relay_limits_come_from_the_config_section() -> None:
    """Every relay limit is the websocket section's value of the same name."""
    config = WebSocketConfig(buffer_bytes=4096, idle_timeout_ms=250, max_messages_per_s=7.0)
    limits = relay_limits(config)
    for name in RelayLimits.__dataclass_fields__:
        assert getattr(limits, name) == getattr(config, name), name
    assert limits.idle_timeout_s == 0.25


@pytest.mark.parametrize(
    ("key", "value", "bound"),
    [
        ("max_connections_per_client", 0, "greater than or equal to 1"),
        ("buffer_bytes", 10, "greater than or equal to 1024"),
        ("idle_timeout_ms", 10, "greater than or equal to 100"),
        ("send_timeout_ms", 0, "greater than or equal to 1"),
        ("close_timeout_ms", 0, "greater than or equal to 1"),
        ("max_messages_per_s", 0.5, "greater than or equal to 1"),
        ("max_bytes_per_s", 2**40, "less than or equal to 17179869184"),
    ],
)
def test_bad_websocket_keys_are_errors_naming_field_and_range(
    key: str, value: float, bound: str
) -> None:
    """An out-of-range websocket key fails config loading with the key and its bound."""
    with pytest.raises(ConfigError) as error:
        build_config({"websocket": {key: value}}, require_upstream=False)
    assert f"websocket.{key}" in str(error.value) and bound in str(error.value)


def test_the_cli_server_takes_the_message_size_from_the_websocket_section() -> None:
    """uvicorn_settings: --ws-max-size is websocket.max_message_bytes (uvicorn's is 16 MiB),
    and the websocket protocol is the paced one with the section's rates."""
    config = WebSocketConfig(max_message_bytes=4096, max_messages_per_s=50.0)
    settings = uvicorn_settings(ServerConfig(), config)
    assert settings["ws_max_size"] == 4096
    assert issubclass(settings["ws"], PacedWebSocketProtocol)
    assert settings["ws"].max_frames_per_s == 50.0


def test_uvicorn_importing_the_gateway_gets_the_message_size() -> None:
    """adopt_uvicorn: a uvicorn Config left at 16 MiB takes max_message_bytes; a flag stays."""
    gw = build_gateway(
        build_config({"upstream": "http://u.test", "websocket": {"max_message_bytes": 8192}}),
        env={},
    )

    def load(self: Config) -> bool:  # uvicorn's Config.load frame: ``self`` is the config
        return adopt_uvicorn(gw, sys._getframe())

    quiet = {"access_log": False, "proxy_headers": False}  # no global logging changes
    default, flagged = Config(gw, **quiet), Config(gw, ws_max_size=99_999, **quiet)
    default.ws_protocol_class = AutoWebSocketsProtocol  # what Config.load resolved first
    flagged.ws_protocol_class = ChosenProtocol  # --ws named another implementation
    assert load(default) and load(flagged)
    assert (default.ws_max_size, flagged.ws_max_size) == (8192, 99_999)
    assert issubclass(default.ws_protocol_class, PacedWebSocketProtocol)
    assert flagged.ws_protocol_class is ChosenProtocol


class ChosenProtocol:
    """Stands for a websocket implementation chosen with uvicorn's --ws."""


@pytest.mark.anyio
async def test_a_reload_applies_the_websocket_caps_and_relay_limits(tmp_path: Path) -> None:
    """SIGHUP/POST reload: new upgrades see the new caps, new relays the new limits."""
    path = tmp_path / "gw.yaml"
    path.write_text("upstream: http://u.test\n")
    gw = build_gateway(load_config(env={}, path=path), config_path=path, env={})
    path.write_text(
        "upstream: http://u.test\nwebsocket:\n  max_connections: 4\n"
        "  max_connections_per_client: 1\n  idle_timeout_ms: 500\n"
    )
    ok, message = await gw.reload()
    assert ok, message
    cap = gw.websockets.cap
    assert (cap.max_connections, cap.shared, cap.max_per_client) == (4, 3, 1)
    assert gw.websockets.limits.idle_timeout_ms == 500
    assert gw.snapshot()["websocket"]["max_per_client"] == 1
