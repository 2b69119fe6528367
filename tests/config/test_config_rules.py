"""Issue 8 validation rules: one test per rule, each message names the key path.

Complements tests/config/test_config.py (which covers the first examples of several
rules) with the other bounds, nested and `gateway:`-wrapped files, and the
priority, CIDR and shed-status rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ballast_asgi.config import load_config
from ballast_asgi.core.errors import ConfigError

HEAD = "upstream: http://127.0.0.1:9101\n"


def _error(tmp_path: Path, body: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(HEAD + body)
    with pytest.raises(ConfigError) as info:
        load_config(env={}, path=path)
    message = str(info.value)
    assert str(path) in message, "the message names the file"
    assert "\n" not in message, "one line"
    return message


def _loads(tmp_path: Path, body: str) -> None:
    path = tmp_path / "good.yaml"
    path.write_text(HEAD + body)
    load_config(env={}, path=path)


def test_enabled_queue_needs_a_cap_even_when_wrapped(tmp_path: Path) -> None:
    """`gateway:`-nested enabled queue with max_concurrent_requests: null is rejected."""
    body = "max_concurrent_requests: null\nadmission_queue:\n  enabled: true\n"
    wrapped = "gateway:\n" + "".join(f"  {line}\n" for line in (HEAD + body).splitlines())
    path = tmp_path / "wrapped.yaml"
    path.write_text(wrapped)
    with pytest.raises(ConfigError) as info:
        load_config(env={}, path=path)
    assert "max_concurrent_requests" in str(info.value)
    assert "admission_queue.enabled" in str(info.value)


def test_uncapped_gateway_is_fine_with_the_queue_disabled(tmp_path: Path) -> None:
    """The cap rule only applies to an enabled queue."""
    _loads(tmp_path, "max_concurrent_requests: null\nadmission_queue:\n  enabled: false\n")


@pytest.mark.parametrize(("value", "bound"), [(10_001, "10000"), (-5, "1"), ("big", "integer")])
def test_max_queue_size_outside_1_to_10000(tmp_path: Path, value: object, bound: str) -> None:
    """admission_queue.max_queue_size must be an integer in 1..10000."""
    msg = _error(tmp_path, f"admission_queue:\n  max_queue_size: {value}\n")
    assert "admission_queue.max_queue_size" in msg and bound in msg


@pytest.mark.parametrize("size", [1, 10_000])
def test_max_queue_size_bounds_are_inclusive(tmp_path: Path, size: int) -> None:
    """1 and 10000 themselves are allowed."""
    _loads(tmp_path, f"admission_queue:\n  max_queue_size: {size}\n")


@pytest.mark.parametrize(("value", "bound"), [(0, "1"), (10_001, "10000"), (2.5, "integer")])
def test_queue_timeout_ms_outside_1_to_10000(tmp_path: Path, value: object, bound: str) -> None:
    """admission_queue.queue_timeout_ms must be an integer in 1..10000 (or null)."""
    msg = _error(tmp_path, f"admission_queue:\n  queue_timeout_ms: {value}\n")
    assert "admission_queue.queue_timeout_ms" in msg and bound in msg


def test_unknown_top_level_key(tmp_path: Path) -> None:
    """A misspelt top-level key is an error naming it."""
    msg = _error(tmp_path, "max_concurent_requests: 10\n")
    assert "max_concurent_requests: unknown key" in msg


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ("priority:\n  consumers:\n    api_key: x\n", "priority.consumers.api_key"),
        ("priority:\n  rules:\n    - path: /a\n      prio: 0\n", "priority.rules.0.prio"),
        ("limiter:\n  windw_ms: 100\n", "limiter.windw_ms"),
        ("admin:\n  password: x\n", "admin.password"),
    ],
)
def test_unknown_nested_key(tmp_path: Path, body: str, path: str) -> None:
    """Unknown keys at any depth (including inside list items) name their full path."""
    assert f"{path}: unknown key" in _error(tmp_path, body)


def test_default_min_limit_above_a_low_max_limit(tmp_path: Path) -> None:
    """Lowering only max_limit below the default min_limit is caught and explained."""
    msg = _error(tmp_path, "limiter:\n  max_limit: 2\n")
    assert "limiter.min_limit (4)" in msg and "limiter.max_limit (2)" in msg


def test_initial_limit_outside_min_max(tmp_path: Path) -> None:
    """limiter.initial_limit must lie within [min_limit, max_limit]."""
    msg = _error(tmp_path, "limiter:\n  min_limit: 10\n  max_limit: 20\n  initial_limit: 50\n")
    assert "limiter.initial_limit" in msg and "[10, 20]" in msg


@pytest.mark.parametrize("cidr", ["10.0.0.0/33", "300.1.1.1/8", "fd00::/129", "intranet", ""])
def test_bad_cidr_is_rejected_naming_the_value(tmp_path: Path, cidr: str) -> None:
    """priority.trusted_networks rejects an invalid CIDR and quotes it."""
    msg = _error(tmp_path, f"priority:\n  trusted_networks: ['10.0.0.0/8', '{cidr}']\n")
    assert "priority.trusted_networks" in msg and f"invalid CIDR {cidr!r}" in msg


def test_good_cidrs_are_accepted(tmp_path: Path) -> None:
    """IPv4, IPv6, bare addresses and host bits set are all valid networks."""
    nets = "['10.0.0.0/8', 'fd00::/8', '192.168.1.7', '172.16.5.4/12', '::1']"
    _loads(tmp_path, f"priority:\n  trust_header: false\n  trusted_networks: {nets}\n")


@pytest.mark.parametrize(
    ("body", "path"),
    [
        (
            "priority:\n  rules:\n    - path: /a\n      priority: urgent\n",
            "priority.rules.0.priority",
        ),
        ("priority:\n  default: high\n", "priority.default"),
        ("priority:\n  consumers:\n    keys: {k1: 7}\n", "priority.consumers.keys"),
    ],
)
def test_bad_priority_name(tmp_path: Path, body: str, path: str) -> None:
    """A tier that is not 0/critical, 1/standard, 2/bulk names the key and the allowed tiers."""
    msg = _error(tmp_path, body)
    assert path in msg and "0/critical, 1/standard, 2/bulk" in msg


def test_rule_without_priority(tmp_path: Path) -> None:
    """A rule must say which tier it assigns."""
    msg = _error(tmp_path, "priority:\n  rules:\n    - path: /a\n")
    assert "priority.rules.0.priority: required key is missing" in msg


@pytest.mark.parametrize(("status", "bound"), [(200, "400"), (600, "599"), ("teapot", "integer")])
def test_bad_shed_status(tmp_path: Path, status: object, bound: str) -> None:
    """shed.status must be an HTTP error status in 400..599."""
    msg = _error(tmp_path, f"shed:\n  status: {status}\n")
    assert "shed.status" in msg and bound in msg


def test_breaker_open_above_max_open(tmp_path: Path) -> None:
    """breaker.open_ms must not exceed breaker.max_open_ms."""
    msg = _error(tmp_path, "breaker:\n  open_ms: 90000\n  max_open_ms: 60000\n")
    assert "breaker.open_ms" in msg and "breaker.max_open_ms" in msg


def test_reserved_fraction_outside_unit_interval(tmp_path: Path) -> None:
    """admission_queue.reserved_fraction is a ratio in [0, 1]."""
    msg = _error(tmp_path, "admission_queue:\n  reserved_fraction: 1.5\n")
    assert "admission_queue.reserved_fraction" in msg and "1" in msg


def test_section_must_be_a_mapping(tmp_path: Path) -> None:
    """A scalar where a section belongs names the section."""
    assert "admission_queue" in _error(tmp_path, "admission_queue: yes\n")
