"""Config loading: layering, validation messages that name the key and range."""

from __future__ import annotations

from pathlib import Path

import pytest

from ballast_asgi.config import GatewayConfig, load_config
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.priority import Priority

UP = {"BALLAST_UPSTREAM": "http://127.0.0.1:9101"}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ballast.yaml"
    path.write_text(text)
    return path


def _error(**kw: object) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(**kw)  # type: ignore[arg-type]
    return str(info.value)


def test_defaults_from_env_only() -> None:
    """A bare upstream gives the documented defaults (gradient, queue on, 429)."""
    cfg = load_config(env=UP)
    assert cfg.upstream == "http://127.0.0.1:9101"
    assert cfg.limiter.algorithm == "gradient"
    assert cfg.admission_queue.enabled
    assert cfg.shed.status == 429
    assert cfg.priority.default is Priority.STANDARD


def test_env_overrides_yaml(tmp_path: Path) -> None:
    """BALLAST_LIMITER and BALLAST_FIXED_LIMIT win over the file."""
    path = _write(tmp_path, "upstream: http://127.0.0.1:1\nlimiter:\n  algorithm: gradient\n")
    env = {"BALLAST_CONFIG": str(path), "BALLAST_LIMITER": "fixed", "BALLAST_FIXED_LIMIT": "16"}
    cfg = load_config(env=env)
    assert cfg.limiter.algorithm == "fixed"
    assert cfg.fixed_limit == 16
    assert cfg.upstream == "http://127.0.0.1:1"


def test_gateway_wrapper_key_is_unwrapped(tmp_path: Path) -> None:
    """A file nesting everything under `gateway:` (the seed's layout) loads."""
    path = _write(
        tmp_path,
        "gateway:\n  upstream: http://127.0.0.1:2\n  max_concurrent_requests: 100\n"
        "  admission_queue:\n    enabled: true\n    max_queue_size: 200\n"
        "    queue_timeout_ms: 50\n    per_priority: true\n",
    )
    cfg = load_config(env={}, path=path)
    assert cfg.max_concurrent_requests == 100
    assert cfg.admission_queue.queue_timeout_ms == 50


def test_missing_upstream_names_the_variable() -> None:
    """No upstream anywhere: the message names BALLAST_UPSTREAM."""
    assert "BALLAST_UPSTREAM" in _error(env={})


def test_bad_upstream_url_names_the_field() -> None:
    """A non-URL upstream names the key and the expected form."""
    msg = _error(env={"BALLAST_UPSTREAM": "localhost:9101"})
    assert "upstream" in msg and "http://" in msg


def test_unknown_limiter_lists_allowed_values() -> None:
    """BALLAST_LIMITER with an unknown name lists the allowed ones."""
    msg = _error(env={**UP, "BALLAST_LIMITER": "magic"})
    assert "BALLAST_LIMITER" in msg and "gradient" in msg and "fixed" in msg


@pytest.mark.parametrize("raw", ["abc", "0", "-3", "1.5"])
def test_bad_fixed_limit_names_the_variable(raw: str) -> None:
    """BALLAST_FIXED_LIMIT must be a positive integer."""
    assert "BALLAST_FIXED_LIMIT" in _error(env={**UP, "BALLAST_FIXED_LIMIT": raw})


def test_unknown_key_is_rejected(tmp_path: Path) -> None:
    """Typos are errors, not silently ignored."""
    path = _write(tmp_path, "upstream: http://127.0.0.1:1\nadmission_queue:\n  max_size: 3\n")
    assert "admission_queue.max_size: unknown key" in _error(env={}, path=path)


def test_queue_size_out_of_range_names_key_and_range(tmp_path: Path) -> None:
    """max_queue_size must be within 1..10000."""
    path = _write(tmp_path, "upstream: http://127.0.0.1:1\nadmission_queue:\n  max_queue_size: 0\n")
    msg = _error(env={}, path=path)
    assert "admission_queue.max_queue_size" in msg and "1" in msg


def test_queue_timeout_out_of_range(tmp_path: Path) -> None:
    """queue_timeout_ms must be within 1..10000."""
    text = "upstream: http://127.0.0.1:1\nadmission_queue:\n  queue_timeout_ms: 20000\n"
    msg = _error(env={}, path=_write(tmp_path, text))
    assert "admission_queue.queue_timeout_ms" in msg and "10000" in msg


def test_enabled_queue_without_cap_is_rejected(tmp_path: Path) -> None:
    """An enabled queue needs max_concurrent_requests."""
    text = "upstream: http://127.0.0.1:1\nmax_concurrent_requests: null\n"
    msg = _error(env={}, path=_write(tmp_path, text))
    assert "max_concurrent_requests" in msg and "admission_queue.enabled" in msg


def test_min_limit_above_max_is_rejected(tmp_path: Path) -> None:
    """limiter.min_limit must not exceed limiter.max_limit."""
    text = "upstream: http://127.0.0.1:1\nlimiter:\n  min_limit: 50\n  max_limit: 10\n"
    msg = _error(env={}, path=_write(tmp_path, text))
    assert "limiter.min_limit" in msg and "limiter.max_limit" in msg


def test_invalid_yaml_and_missing_file(tmp_path: Path) -> None:
    """Unreadable or unparsable files give one line, not a traceback."""
    assert "cannot read" in _error(env={}, path=tmp_path / "nope.yaml")
    assert "not valid YAML" in _error(env={}, path=_write(tmp_path, "a: [1,\n"))


def test_config_is_frozen() -> None:
    """Config objects are immutable values."""
    cfg = load_config(env=UP)
    with pytest.raises(ValueError):
        cfg.shed.status = 503  # type: ignore[misc]
    assert isinstance(cfg, GatewayConfig)


def test_priority_names_accepted_in_rules(tmp_path: Path) -> None:
    """Tiers in config accept the header's tokens."""
    text = (
        "upstream: http://127.0.0.1:1\npriority:\n  default: bulk\n  rules:\n"
        "    - path: /checkout/*\n      methods: [POST]\n      priority: 0\n"
    )
    cfg = load_config(env={}, path=_write(tmp_path, text))
    assert cfg.priority.default is Priority.BULK
    assert cfg.priority.rules[0].priority is Priority.CRITICAL


def test_retry_statuses_must_be_5xx(tmp_path: Path) -> None:
    """retry.retry_statuses accepts only 5xx codes and names the key otherwise."""
    text = "upstream: http://127.0.0.1:1\nretry:\n  retry_statuses: [503, 404]\n"
    msg = _error(env={}, path=_write(tmp_path, text))
    assert "retry.retry_statuses" in msg and "404" in msg


def test_bare_cap_selects_the_fixed_limiter(tmp_path: Path) -> None:
    """max_concurrent_requests without limiter.algorithm is the fixed limiter at that cap."""
    cfg = load_config(
        env={}, path=_write(tmp_path, "upstream: http://a.test\nmax_concurrent_requests: 5\n")
    )
    assert (cfg.limiter.algorithm, cfg.fixed_limit) == ("fixed", 5)
    text = "upstream: http://a.test\nmax_concurrent_requests: 5\nlimiter:\n  algorithm: gradient\n"
    cfg = load_config(env={}, path=_write(tmp_path, text))
    assert (cfg.limiter.algorithm, cfg.max_limit) == ("gradient", 5)
    env = {"BALLAST_LIMITER": "gradient"}
    cfg = load_config(
        env=env, path=_write(tmp_path, "upstream: http://a.test\nmax_concurrent_requests: 5\n")
    )
    assert cfg.limiter.algorithm == "gradient"
    assert load_config(env={"BALLAST_UPSTREAM": "http://a.test"}).limiter.algorithm == "gradient"


@pytest.mark.parametrize(
    ("key", "value", "bound"),
    [("max_response_headers", 0, "1"), ("max_response_headers", 10_001, "10000"),
     ("max_response_head_bytes", 1_023, "1024"), ("max_response_head_bytes", 262_145, "262144")],
)  # fmt: skip
def test_response_head_limits_out_of_range_name_key_and_range(
    tmp_path: Path, key: str, value: int, bound: str
) -> None:
    """proxy.max_response_headers (1..10000) and max_response_head_bytes (1024..262144)."""
    text = f"upstream: http://127.0.0.1:1\nproxy:\n  {key}: {value}\n"
    msg = _error(env={}, path=_write(tmp_path, text))
    assert f"proxy.{key}" in msg and bound in msg


def test_response_head_limits_default_to_envoy_and_nginx_sizes() -> None:
    """100 fields (Envoy's max_response_headers_count) and 64 KiB of names and values."""
    proxy = load_config(env=UP).proxy
    assert (proxy.max_response_headers, proxy.max_response_head_bytes) == (100, 65_536)
