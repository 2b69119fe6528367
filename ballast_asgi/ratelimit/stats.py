"""Plain counters the drivers bump on the hot path; exported at scrape time (``metrics.py``)."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field

#: Redis call latency buckets, seconds (0.1 ms .. 1 s).
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.1, 1.0)

ALLOWED = "allowed"
DENIED = "denied"
#: Where a decision came from: Redis itself, local state Redis fed (lease, sync
#: bucket, "empty until"), the process alone (local mode), or this gateway's own
#: share because Redis did not answer in time (degraded).
SOURCES = ("redis", "local", "degraded")


@dataclass
class RateLimitStats:
    """Counts by (outcome, source), Redis calls by (op, result), and a latency histogram."""

    decisions: Counter[tuple[str, str]] = field(default_factory=Counter)
    redis_calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0
    lease_requests: int = 0
    lease_tokens_granted: int = 0
    lease_tokens_returned: int = 0
    last_lease_size: int = 0
    charged_back: int = 0
    charge_lapsed: int = 0
    #: How long requests waited for their decision (the middleware's ``await decide``).
    wait_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    wait_sum: float = 0.0
    wait_max: float = 0.0

    def decided(self, allowed: bool, source: str) -> None:
        """Count one decision."""
        self.decisions[(ALLOWED if allowed else DENIED, source)] += 1

    def call(self, op: str, result: str, seconds: float | None) -> None:
        """Count one Redis call (``result``: ok, error, timeout) and its latency if known."""
        self.redis_calls[(op, result)] += 1
        if seconds is not None:
            self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            self.latency_sum += seconds

    def waited(self, seconds: float) -> None:
        """Record how long one request waited for its decision."""
        self.wait_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.wait_sum += seconds
        if seconds > self.wait_max:
            self.wait_max = seconds

    @property
    def total_decisions(self) -> int:
        """Every decision made."""
        return sum(self.decisions.values())

    @property
    def total_calls(self) -> int:
        """Every Redis call started."""
        return sum(self.redis_calls.values())

    def snapshot(self) -> dict[str, object]:
        """JSON-safe counts."""
        return {
            "decisions": {f"{o}/{s}": n for (o, s), n in sorted(self.decisions.items())},
            "redis_calls": {f"{op}/{r}": n for (op, r), n in sorted(self.redis_calls.items())},
            "lease": {
                "requests": self.lease_requests,
                "tokens_granted": self.lease_tokens_granted,
                "tokens_returned": self.lease_tokens_returned,
                "last_size": self.last_lease_size,
            },
            "charge_back": {"charged": self.charged_back, "lapsed": self.charge_lapsed},
            "decision_wait": {
                "max_ms": round(self.wait_max * 1000, 3),
                "buckets_s": dict(
                    zip(map(str, (*LATENCY_BUCKETS, "inf")), self.wait_counts, strict=True)
                ),
            },
        }
