"""One default per value: the cores own defaults and checks; the models reference them.

And the limiter algorithm comes from ``limiter.algorithm`` alone, except for the
reference layout rule of a config document (``config/load.py::reference_layout``).
"""

from __future__ import annotations

import inspect
import logging
import random
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from ballast_asgi.config import (
    AdmissionQueueConfig,
    BreakerConfig,
    GatewayConfig,
    GradientConfig,
    LimiterConfig,
    RetryConfig,
    build_config,
    load_config,
)
from ballast_asgi.config.load import reference_layout
from ballast_asgi.config.models import WebSocketConfig
from ballast_asgi.core.breaker import Breaker
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.limit import AIMDLimit, Gradient2Limit, GradientLimit, VegasLimit
from ballast_asgi.core.limit.base import check_bounds
from ballast_asgi.core.outcome import DEFAULT_RETRY_STATUSES
from ballast_asgi.core.queue import PriorityQueue
from ballast_asgi.core.retry_budget import RetryBudget
from ballast_asgi.core.websocket import DEFAULT_MAX_CONNECTIONS_PER_CLIENT, RelayLimits


def _core_default(cls: Any, param: str) -> Any:
    return inspect.signature(cls.__init__).parameters[param].default


def _model_default(model: type[BaseModel], field: str) -> Any:
    return model.model_fields[field].default


# (model, field, core class, core parameter)
PAIRS = [
    (AdmissionQueueConfig, "max_queue_size", PriorityQueue, "max_size"),
    (AdmissionQueueConfig, "lifo_threshold", PriorityQueue, "lifo_threshold"),
    (AdmissionQueueConfig, "per_priority", PriorityQueue, "per_priority"),
    (AdmissionQueueConfig, "reserved_fraction", PriorityQueue, "reserved_fraction"),
    (RetryConfig, "budget_ratio", RetryBudget, "budget_ratio"),
    (RetryConfig, "window_ms", RetryBudget, "window_ms"),
    (RetryConfig, "min_retries_per_s", RetryBudget, "min_retries_per_s"),
    (LimiterConfig, "window_ms", GradientLimit, "window_ms"),
    *[
        (LimiterConfig, bound, algorithm, bound)
        for algorithm in (GradientLimit, Gradient2Limit, AIMDLimit, VegasLimit)
        for bound in ("initial_limit", "min_limit", "max_limit")
    ],
    *[(GradientConfig, name, GradientLimit, name) for name in GradientConfig.model_fields],
    *[
        (BreakerConfig, name, Breaker, name)
        for name in inspect.signature(Breaker.__init__).parameters
        if name != "self"
    ],
    *[(WebSocketConfig, name, RelayLimits, name) for name in RelayLimits.__dataclass_fields__],
]


@pytest.mark.parametrize(
    ("model", "field", "core", "param"),
    PAIRS,
    ids=[f"{m.__name__}.{f}={c.__name__}.{p}" for m, f, c, p in PAIRS],
)
def test_model_default_is_the_core_default(
    model: type[BaseModel], field: str, core: Any, param: str
) -> None:
    """Each config default equals the default of the core that uses it."""
    assert _model_default(model, field) == _core_default(core, param)


def test_websocket_per_client_cap_default_comes_from_the_core() -> None:
    """websocket.max_connections_per_client defaults to the core's constant."""
    assert WebSocketConfig().max_connections_per_client == DEFAULT_MAX_CONNECTIONS_PER_CLIENT


def test_retry_statuses_default_comes_from_the_core() -> None:
    """retry.retry_statuses defaults to the core's DEFAULT_RETRY_STATUSES."""
    assert RetryConfig().retry_statuses == DEFAULT_RETRY_STATUSES


def test_limiter_bounds_are_checked_by_the_core_rule() -> None:
    """LimiterConfig rejects bounds with the core's check, its names prefixed ``limiter.``."""
    with pytest.raises(ValueError) as core_error:
        check_bounds(50, 10, 20, prefix="limiter.")
    with pytest.raises(ValidationError) as model_error:
        LimiterConfig(min_limit=10, max_limit=20, initial_limit=50)
    assert str(core_error.value) in str(model_error.value)


def test_python_config_takes_the_algorithm_only_from_limiter_algorithm() -> None:
    """GatewayConfig() and GatewayConfig(max_concurrent_requests=1000) are the same config."""
    assert GatewayConfig() == GatewayConfig(max_concurrent_requests=1000)
    assert GatewayConfig(max_concurrent_requests=5).limiter.algorithm == "gradient"
    fixed = GatewayConfig(max_concurrent_requests=5, limiter=LimiterConfig(algorithm="fixed"))
    assert (fixed.limiter.algorithm, fixed.fixed_limit) == ("fixed", 5)


def test_a_document_with_a_bare_cap_means_the_fixed_limiter() -> None:
    """The reference layout: a cap and no algorithm in a config document is a fixed cap."""
    cfg = build_config({"max_concurrent_requests": 5}, require_upstream=False)
    assert (cfg.limiter.algorithm, cfg.fixed_limit) == ("fixed", 5)
    assert build_config({}, require_upstream=False).limiter.algorithm == "gradient"


@pytest.mark.parametrize(
    ("data", "overrides", "algorithm"),
    [
        ({"max_concurrent_requests": 5, "limiter": {"algorithm": "vegas"}}, {}, "vegas"),
        ({"max_concurrent_requests": 5}, {"limiter.algorithm": "gradient"}, "gradient"),
        ({"max_concurrent_requests": None, "admission_queue": {"enabled": False}}, {}, "gradient"),
        ({"limiter": {"initial_limit": 8}}, {}, "gradient"),
    ],
)
def test_a_named_algorithm_or_no_cap_leaves_the_rule_out(
    data: dict[str, Any], overrides: dict[str, Any], algorithm: str
) -> None:
    """A named algorithm (file, env or flag) wins; a null or missing cap chooses nothing."""
    cfg = build_config(data, overrides, require_upstream=False)
    assert cfg.limiter.algorithm == algorithm


def test_the_rule_reads_the_merged_document() -> None:
    """reference_layout says whether it applied and writes only limiter.algorithm."""
    doc: dict[str, Any] = {"max_concurrent_requests": 7, "limiter": {"initial_limit": 3}}
    assert reference_layout(doc) is True
    assert doc == {
        "max_concurrent_requests": 7,
        "limiter": {"initial_limit": 3, "algorithm": "fixed"},
    }
    assert reference_layout(doc) is False  # now named
    assert reference_layout({"max_concurrent_requests": 7, "limiter": "bad"}) is False


def test_environment_limiter_beats_the_rule() -> None:
    """BALLAST_LIMITER names the algorithm, so the bare cap of the file does not choose it."""
    env = {"BALLAST_UPSTREAM": "http://a.test", "BALLAST_LIMITER": "aimd"}
    cfg = load_config(env=env, overrides={"max_concurrent_requests": 9})
    assert cfg.limiter.algorithm == "aimd"


def test_the_rule_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Applying the rule is not silent: one info line names it."""
    with caplog.at_level(logging.INFO, logger="ballast.config"):
        build_config({"max_concurrent_requests": 5}, source="gw.yaml", require_upstream=False)
    assert "gw.yaml: max_concurrent_requests without limiter.algorithm" in caplog.text


def test_gradient_rules_reach_the_controller() -> None:
    """limiter.gradient.* keys become the gradient controller's parameters."""
    from ballast_asgi.gateway.stack import make_algorithm

    rules = {"queue_tolerance": 2.0, "slow_start_step": 0.25}
    cfg = build_config({"limiter": {"gradient": rules}}, require_upstream=False)
    algo = make_algorithm(cfg, random.Random(1))
    assert isinstance(algo, GradientLimit)
    assert (algo.queue_tolerance, algo.slow_start_step) == (2.0, 0.25)


@pytest.mark.parametrize(
    ("rules", "field"),
    [
        ({"queue_tolerance": 0.5}, "queue_tolerance"),
        ({"backoff_ratio": 1.0}, "backoff_ratio"),
        ({"shrink_headroom": 0.5}, "limiter.gradient: shrink_headroom"),
        ({"probe_interval_s": 0}, "probe_interval_s"),
        ({"nonsense": 1}, "nonsense"),
    ],
)
def test_bad_gradient_rules_name_the_key(rules: dict[str, Any], field: str) -> None:
    """A bad or unknown limiter.gradient key is a validation error naming it."""
    with pytest.raises(ConfigError, match=field):
        build_config({"limiter": {"gradient": rules}}, require_upstream=False)
