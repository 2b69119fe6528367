"""Per-upstream-host state of a ``BallastTransport`` and its bounded table (pure).

A host (``scheme://host:port``) has

* an ``AdaptiveThrottle`` (local rejection when the host refuses calls),
* a ``RetryBudget`` shared by every call to that host (the gateway's core),
* ``latency_s``: an EWMA (``alpha = 0.2``) of the time to the response head
  of the calls it accepted, the "recent latency" a budget is checked against,
* ``blocked_until``: per tier, until when a ``Retry-After`` from a shed asks
  the client not to call. A shed of tier ``t`` blocks ``t`` and every less
  important tier (a downstream sheds its lowest tier first, so a bulk shed
  says nothing about critical calls).

The table keeps at most ``max_hosts`` entries and drops the least recently
used one beyond that: URLs chosen by the client's callers cannot grow memory
without bound. Metric labels are bounded the same way: the first
``metrics_max_hosts`` hosts seen get their own label (kept for the
transport's life), every later host shares ``other``; counters live per
label (``LabelCounts``), so they survive a host's eviction.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass
from typing import Any

from ballast_asgi.client.core.config import ClientConfig
from ballast_asgi.client.core.throttle import AdaptiveThrottle
from ballast_asgi.core.priority import Priority
from ballast_asgi.core.retry_budget import RetryBudget

LATENCY_ALPHA = 0.2
#: Hosts listed in a snapshot (the most recently used).
SNAPSHOT_HOSTS = 64
OTHER = "other"
_TIERS = len(Priority)


@dataclass(slots=True)
class LabelCounts:
    """Monotonic counters of one metrics label (one host, or every ``other`` host)."""

    sent: int = 0
    retried: int = 0
    retry_denied: int = 0
    throttled: int = 0
    backed_off: int = 0
    no_budget: int = 0
    shed: int = 0
    failed: int = 0

    def as_dict(self) -> dict[str, int]:
        """JSON-safe counts."""
        return asdict(self)


class HostState:
    """Throttle, retry budget, latency and back-off of one upstream host."""

    __slots__ = ("blocked_until", "budget", "counts", "label", "latency_s", "throttle")

    def __init__(self, config: ClientConfig, label: str, counts: LabelCounts) -> None:
        self.label = label
        self.counts = counts
        self.throttle = AdaptiveThrottle(
            k=config.throttle_k,
            window_ms=config.throttle_window_ms,
            min_requests=config.throttle_min_requests,
        )
        self.budget = RetryBudget(
            budget_ratio=config.budget_ratio,
            window_ms=config.budget_window_ms,
            min_retries_per_s=config.min_retries_per_s,
        )
        self.latency_s: float | None = None
        self.blocked_until = [0.0] * _TIERS

    def note_latency(self, rtt_s: float) -> None:
        """Fold one accepted call's time to the response head into the EWMA."""
        if self.latency_s is None:
            self.latency_s = rtt_s
        else:
            self.latency_s += LATENCY_ALPHA * (rtt_s - self.latency_s)

    def note_shed(self, now: float, priority: Priority, retry_after_s: float) -> None:
        """A shed of ``priority``: block it and the less important tiers for ``retry_after_s``."""
        until = now + retry_after_s
        for tier in range(int(priority), _TIERS):
            if until > self.blocked_until[tier]:
                self.blocked_until[tier] = until

    def blocked_s(self, now: float, priority: Priority) -> float:
        """Seconds calls of ``priority`` must still wait (0 when not blocked)."""
        return max(0.0, self.blocked_until[int(priority)] - now)

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON-safe state for the ``client`` section of ``/_ballast/snapshot``."""
        budget = self.budget
        return {
            "label": self.label,
            "throttle": {
                "requests_in_window": self.throttle.requests(now),
                "accepts_in_window": self.throttle.accepts(now),
                "reject_probability": round(self.throttle.reject_probability(now), 4),
            },
            "retry_budget": {
                "balance": round(budget.balance(now), 3),
                "allowance": round(budget.allowance(now), 3),
                "originals_in_window": budget.snapshot(now)["originals_in_window"],
                "retries_in_window": budget.snapshot(now)["retries_in_window"],
            },
            "latency_ms": None if self.latency_s is None else round(self.latency_s * 1000.0, 3),
            "blocked_s": {p.label: round(self.blocked_s(now, p), 3) for p in Priority},
        }


class HostTable:
    """Host states by ``scheme://host:port``: LRU-bounded, with capped metric labels."""

    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self._hosts: OrderedDict[str, HostState] = OrderedDict()
        #: Counters by metrics label: at most ``metrics_max_hosts + 1`` entries.
        self.labels: dict[str, LabelCounts] = {}
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._hosts)

    def get(self, key: str) -> HostState:
        """The state of host ``key`` (created, and the oldest dropped, as needed)."""
        state = self._hosts.get(key)
        if state is not None:
            self._hosts.move_to_end(key)
            return state
        label = self._label(key)
        state = HostState(self.config, label, self.labels[label])
        self._hosts[key] = state
        if len(self._hosts) > self.config.max_hosts:
            self._hosts.popitem(last=False)
            self.evicted += 1
        return state

    def _label(self, key: str) -> str:
        if key in self.labels:
            return key
        named = len(self.labels) - (OTHER in self.labels)
        label = key if named < self.config.metrics_max_hosts else OTHER
        if label not in self.labels:
            self.labels[label] = LabelCounts()
        return label

    def items(self) -> list[tuple[str, HostState]]:
        """The hosts held now, least recently used first."""
        return list(self._hosts.items())

    def totals(self) -> LabelCounts:
        """Every counter summed over the labels."""
        total = LabelCounts()
        for counts in self.labels.values():
            for name, value in counts.as_dict().items():
                setattr(total, name, getattr(total, name) + value)
        return total

    def snapshot(self, now: float) -> dict[str, Any]:
        """Totals, per-label counters and the most recently used hosts' state."""
        held = self.items()[-SNAPSHOT_HOSTS:]
        return {
            **self.totals().as_dict(),
            "hosts_held": len(self._hosts),
            "hosts_evicted": self.evicted,
            "hosts": {key: state.snapshot(now) for key, state in held},
            "by_label": {label: c.as_dict() for label, c in self.labels.items()},
        }
