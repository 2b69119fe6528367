"""The shapes core objects are built from: structural types, so core imports no config.

``config/`` defines the frozen sections (pydantic models); the cores read
them through these protocols (``Breaker.from_config``,
``RetryBudget.from_config``, ``Classifier``), so any object with the fields
will do (a test's plain dataclass, a config section) and the arrow runs from
config to core only (ADR 0005). The composition (``gateway/``) is where a
config section meets the core object built from it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from ballast_asgi.core.priority import Priority


class BreakerSettings(Protocol):
    """What ``Breaker.from_config`` reads (the ``breaker`` section)."""

    @property
    def window_ms(self) -> int: ...
    @property
    def failure_ratio(self) -> float: ...
    @property
    def min_calls(self) -> int: ...
    @property
    def consecutive_failures(self) -> int: ...
    @property
    def open_ms(self) -> int: ...
    @property
    def max_open_ms(self) -> int: ...
    @property
    def half_open_successes(self) -> int: ...
    @property
    def probe_timeout_ms(self) -> int: ...
    @property
    def failure_statuses(self) -> Collection[int]: ...
    @property
    def enabled(self) -> bool: ...
    @property
    def min_failing_clients(self) -> int: ...


class RetryBudgetSettings(Protocol):
    """What ``RetryBudget.from_config`` reads (the ``retry`` section)."""

    @property
    def budget_ratio(self) -> float: ...
    @property
    def window_ms(self) -> int: ...
    @property
    def min_retries_per_s(self) -> float: ...


class ConsumerSettings(Protocol):
    """The consumer-key part of the ``priority`` section."""

    @property
    def header(self) -> str: ...
    @property
    def keys(self) -> Mapping[str, Priority]: ...


class PriorityRuleSettings(Protocol):
    """One ``priority.rules`` entry: methods and a path glob to a tier."""

    @property
    def methods(self) -> Collection[str]: ...
    @property
    def path(self) -> str: ...
    @property
    def priority(self) -> Priority: ...


class PrioritySettings(Protocol):
    """What ``Classifier`` reads (the ``priority`` section)."""

    @property
    def default(self) -> Priority: ...
    @property
    def trust_header(self) -> bool: ...
    @property
    def trusted_networks(self) -> Sequence[str]: ...
    @property
    def consumers(self) -> ConsumerSettings: ...
    @property
    def rules(self) -> Sequence[PriorityRuleSettings]: ...
