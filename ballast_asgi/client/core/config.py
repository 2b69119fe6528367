"""``ClientConfig``: the outgoing-call policy of a ``BallastTransport`` (pure, frozen).

One small value object, validated at construction; an invalid value raises
``ConfigError`` naming the field and the allowed range. Times are in
milliseconds where the name says ``_ms`` and seconds where it says ``_s``.

Defaults and why:

* ``default_deadline_ms = None`` / ``default_priority = None``: outside a
  request that ballast admitted, a call carries no ``X-Deadline-Ms`` /
  ``X-Priority`` and has no budget unless these are set.
* ``min_budget_ms = 5``: a call with less budget than this left is not sent
  (``DeadlineExceeded``); ``latency_guard = True`` also refuses one whose
  budget is below the host's recent latency (the EWMA of its answered calls).
* ``throttle_k = 2``, ``throttle_window_ms = 10_000``,
  ``throttle_min_requests = 10``: the SRE book's client-side adaptive
  throttling; no local rejection before the window holds that many requests
  (the rule's first samples are too few to act on: one failure out of one
  would refuse half the calls).
* ``budget_ratio = 0.1``, ``budget_window_ms = 10_000``,
  ``min_retries_per_s = 0.1``: the gateway's ``RetryBudget`` per host; the
  floor is one retry per 10 s window (the gateway's is ten), so a host that
  fails everything receives at most ``1.1 x originals + 1`` attempts a window.
* ``max_attempts = 3``, ``backoff_base_ms = 25``, ``backoff_max_ms = 1_000``:
  full-jitter backoff ``uniform(0, min(max, base * 2**(retry - 1)))``, cut to
  the deadline.
* ``max_retry_after_s = 30``: a ``Retry-After`` longer than this is cut.
* ``max_hosts = 256`` (least recently used host state dropped beyond it) and
  ``metrics_max_hosts = 32`` (hosts beyond it share the label ``other``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.priority import Priority


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """How a ``BallastTransport`` propagates, throttles and retries (see module doc)."""

    default_deadline_ms: float | None = None
    default_priority: Priority | None = None
    min_budget_ms: float = 5.0
    latency_guard: bool = True
    throttle_k: float = 2.0
    throttle_window_ms: int = 10_000
    throttle_min_requests: int = 10
    budget_ratio: float = 0.1
    budget_window_ms: int = 10_000
    min_retries_per_s: float = 0.1
    max_attempts: int = 3
    backoff_base_ms: float = 25.0
    backoff_max_ms: float = 1_000.0
    max_retry_after_s: float = 30.0
    max_hosts: int = 256
    metrics_max_hosts: int = 32

    def __post_init__(self) -> None:
        if self.default_deadline_ms is not None:
            _range("default_deadline_ms", self.default_deadline_ms, 1.0, 86_400_000.0)
        if self.default_priority is not None and not isinstance(self.default_priority, Priority):
            raise ConfigError("client.default_priority must be a Priority (0, 1 or 2) or None")
        _range("min_budget_ms", self.min_budget_ms, 0.0, 60_000.0)
        _range("throttle_k", self.throttle_k, 1.0, 100.0)
        _range("throttle_window_ms", self.throttle_window_ms, 100, 3_600_000)
        _range("throttle_min_requests", self.throttle_min_requests, 0, 1_000_000)
        _range("budget_ratio", self.budget_ratio, 0.0, 1.0)
        _range("budget_window_ms", self.budget_window_ms, 100, 3_600_000)
        _range("min_retries_per_s", self.min_retries_per_s, 0.0, 1_000.0)
        _range("max_attempts", self.max_attempts, 1, 10)
        _range("backoff_base_ms", self.backoff_base_ms, 0.0, 60_000.0)
        _range("backoff_max_ms", self.backoff_max_ms, self.backoff_base_ms, 600_000.0)
        _range("max_retry_after_s", self.max_retry_after_s, 0.0, 3_600.0)
        _range("max_hosts", self.max_hosts, 1, 100_000)
        _range("metrics_max_hosts", self.metrics_max_hosts, 0, 1_000)

    @property
    def min_budget_s(self) -> float:
        """``min_budget_ms`` in seconds."""
        return self.min_budget_ms / 1000.0


def _range(name: str, value: float, low: float, high: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not low <= value <= high:
        raise ConfigError(f"client.{name} must be in [{low:g}, {high:g}], got {value!r}")
    if isinstance(low, int) and isinstance(high, int) and not isinstance(value, int):
        raise ConfigError(f"client.{name} must be an integer in [{low}, {high}], got {value!r}")
