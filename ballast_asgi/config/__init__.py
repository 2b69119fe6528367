"""Configuration: frozen models (``models``) and loading at the edge (``load``)."""

from __future__ import annotations

from ballast_asgi.config.load import build_config, format_validation_error, load_config, read_yaml
from ballast_asgi.config.models import (
    LIMITER_NAMES,
    AdmissionConfig,
    AdmissionQueueConfig,
    BreakerConfig,
    GatewayConfig,
    GradientConfig,
    HealthCheckConfig,
    LimiterConfig,
    OutlierConfig,
    PriorityConfig,
    PriorityRule,
    ProxyConfig,
    RetryConfig,
    UpstreamInstance,
    UpstreamsConfig,
)

__all__ = [
    "LIMITER_NAMES",
    "AdmissionConfig",
    "AdmissionQueueConfig",
    "BreakerConfig",
    "GatewayConfig",
    "GradientConfig",
    "HealthCheckConfig",
    "LimiterConfig",
    "OutlierConfig",
    "PriorityConfig",
    "PriorityRule",
    "ProxyConfig",
    "RetryConfig",
    "UpstreamInstance",
    "UpstreamsConfig",
    "build_config",
    "format_validation_error",
    "load_config",
    "read_yaml",
]
