"""One default per value: the cores own defaults and checks; the models reference them.

And the limiter algorithm comes from ``limiter.algorithm`` alone, except for the
reference layout rule of a config document (``config/load.py::reference_layout``).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import logging
import pkgutil
import random
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticUndefined

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


def _signature(cls: Any) -> inspect.Signature:
    """``cls.__init__``'s signature as its source writes it (a compiled core has none)."""
    from tests.pure import pure

    source = getattr(pure(cls.__module__), cls.__name__, cls)
    return inspect.signature(source.__init__)


def _core_default(cls: Any, param: str) -> Any:
    return _signature(cls).parameters[param].default


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
        for name in _signature(Breaker).parameters
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


# -- every section: counterparts found by shared names, each default written once ----
def _sections() -> dict[str, type[BaseModel]]:
    """Every config model of ``ballast_asgi.config`` by dotted name."""
    import ballast_asgi.config as package

    out: dict[str, type[BaseModel]] = {}
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__ == info.name:
                out[f"{info.name}.{name}"] = obj
    return out


def _core_classes() -> dict[str, type]:
    """Every class defined in a pure core (tests/test_layering.py's CORES)."""
    from tests.test_layering import CORES

    out: dict[str, type] = {}
    for core in CORES:
        package = importlib.import_module(f"ballast_asgi.{core}")
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if inspect.isclass(obj) and obj.__module__ == info.name:
                    out[f"{info.name}.{name}"] = obj
    return out


def _defaults(cls: type) -> dict[str, Any]:
    try:
        parameters = _signature(cls).parameters
    except (TypeError, ValueError):
        return {}
    empty = inspect.Parameter.empty
    return {n: p.default for n, p in parameters.items() if p.default is not empty}


#: Sections and the core they configure: the fields they share are the same values.
COUNTERPARTS = {
    ("config.policy.AdmissionQueueConfig", "core.queue.PriorityQueue"),
    ("config.policy.RetryConfig", "core.retry_budget.RetryBudget"),
    ("config.policy.LimiterConfig", "core.limit.gradient.GradientLimit"),
    ("config.policy.LimiterConfig", "core.limit.gradient2.Gradient2Limit"),
    ("config.policy.LimiterConfig", "core.limit.aimd.AIMDLimit"),
    ("config.policy.LimiterConfig", "core.limit.vegas.VegasLimit"),
    ("config.policy.GradientConfig", "core.limit.gradient.GradientLimit"),
    ("config.policy.BreakerConfig", "core.breaker.Breaker"),
    ("config.server.WebSocketConfig", "core.websocket.RelayLimits"),
    ("config.upstreams.HealthCheckConfig", "upstreams.core.health.HealthPolicy"),
    ("config.upstreams.OutlierConfig", "upstreams.core.outlier.OutlierPolicy"),
    ("config.upstreams.UpstreamsConfig", "upstreams.core.pool_policy.PoolPolicy"),
    ("config.canary.CanarySequentialConfig", "canary.core.evidence.EvidenceParams"),
}
#: Sections that share three or more field names with a core but not their meaning.
NOT_COUNTERPARTS = {
    # a route's resolved policy, not defaults: the route holds what the sections resolve to
    ("config.models.GatewayConfig", "core.routes.Route"),
    ("config.routes.RouteConfig", "core.routes.Route"),
    # overrides default to None (inherit the gateway's section), never to a value
    ("config.routes.RouteBreakerOverrides", "core.breaker.Breaker"),
    ("config.routes.RouteBreakerOverrides", "upstreams.core.outlier.OutlierPolicy"),
    ("config.routes.RouteRetryOverrides", "core.retry_budget.RetryBudget"),
    ("config.routes.RouteRetryOverrides", "client.core.config.ClientConfig"),
    # a different component with its own defaults (docs/ratelimit.md, docs/client.md)
    ("config.ratelimit.RedisBreakerConfig", "core.breaker.Breaker"),
    ("config.policy.RetryConfig", "client.core.config.ClientConfig"),
    # same names, other things: the outlier's window and failures are not the breaker's
    ("config.policy.BreakerConfig", "upstreams.core.outlier.OutlierPolicy"),
    ("config.upstreams.OutlierConfig", "core.breaker.Breaker"),
    # the canary's split takes the cookie/header names the section validated (no defaults)
    ("config.upstreams.CanaryConfig", "canary.core.split.Split"),
}


#: Fields of a counterpart pair that differ on purpose (each with why).
FIELD_EXCEPTIONS = {
    # the core's None means "no quiet partitions"; the config always asks for some
    ("config.policy.LimiterConfig", "quiet_limit"): "values",
    # core/limit/gradient.py is being split by another change: a DEFAULT_ constant for
    # it lands with that split (the values are equal, checked above)
    ("config.policy.GradientConfig", "route_baselines"): "written",
}


def _short(name: str) -> str:
    return name.removeprefix("ballast_asgi.")


def _pairs() -> list[tuple[str, type[BaseModel], str, type, set[str]]]:
    cores = {name: (cls, _defaults(cls)) for name, cls in _core_classes().items()}
    out = []
    for mname, model in _sections().items():
        for cname, (cls, defaults) in cores.items():
            shared = set(model.model_fields) & set(defaults)
            if len(shared) >= 3:
                out.append((_short(mname), model, _short(cname), cls, shared))
    return out


def test_every_section_sharing_names_with_a_core_is_classified() -> None:
    """A section sharing three or more defaulted names with a core class is a counterpart
    (its defaults checked below) or listed as not one, with the reason."""
    found = {(m, c) for m, _, c, _, _ in _pairs()}
    unknown = found - COUNTERPARTS - NOT_COUNTERPARTS
    assert not unknown, f"classify these (COUNTERPARTS or NOT_COUNTERPARTS): {sorted(unknown)}"
    assert found >= COUNTERPARTS, sorted(COUNTERPARTS - found)


@pytest.mark.parametrize(("model", "core"), sorted(COUNTERPARTS))
def test_counterpart_defaults_are_the_core_values(model: str, core: str) -> None:
    """Every field a section shares with its core has the core's default."""
    pair = next(p for p in _pairs() if (p[0], p[2]) == (model, core))
    _, section, _, cls, shared = pair
    defaults = _defaults(cls)
    wrong = {
        f: (section.model_fields[f].default, defaults[f])
        for f in sorted(shared)
        if FIELD_EXCEPTIONS.get((model, f)) != "values"
        and defaults[f] is not _NESTED  # a nested section: its own pair
        and section.model_fields[f].default not in (defaults[f], PydanticUndefined)
    }
    assert not wrong, f"{model} vs {core}: {wrong}"


#: What a dataclass signature shows for a ``field(default_factory=...)``.
_NESTED: Any = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", object())


@pytest.mark.parametrize(("model", "core"), sorted(COUNTERPARTS))
def test_counterpart_defaults_are_written_once(model: str, core: str) -> None:
    """A section writes no literal default for a field its core defines: it references
    the core's (``DEFAULT_*``, or the core's own default), so the two cannot drift."""
    pair = next(p for p in _pairs() if (p[0], p[2]) == (model, core))
    _, section, _, _, shared = pair
    tree = ast.parse(inspect.getsource(section))
    literal = sorted(
        node.target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and node.target.id in shared
        and FIELD_EXCEPTIONS.get((model, node.target.id)) is None
        and node.value is not None
        and _is_literal(node.value)
    )
    assert not literal, f"{model} writes the default of {literal} again (use {core}'s)"


def _is_literal(value: ast.expr) -> bool:
    """A constant (or a tuple of them), bare or as ``Field``'s first argument."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Field":
        if not value.args:
            return False
        value = value.args[0]
    if isinstance(value, ast.Tuple):
        return all(isinstance(e, ast.Constant) for e in value.elts)
    return isinstance(value, ast.Constant) and value.value is not None
