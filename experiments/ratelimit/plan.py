"""What the rate-limit experiment runs: gateway configs, load shapes and the run list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ballast_asgi.ratelimit.core.gcra import Limits
from experiments.ratelimit.drive import Shape, shifting, spikes, zipf_keys

#: The reference's numbers before scaling.
LIMIT_RPS, BURST = 1000.0, 100
ZIPF_KEYS, ZIPF_RPS, ZIPF_LIMIT_RPS, ZIPF_BURST = 10_000, 3000.0, 20.0, 5


@dataclass(frozen=True)
class Scale:
    """The factor every rate is multiplied by, and run lengths."""

    factor: float = 1.0
    #: 80 % runs, breaker runs and the 10,000-key row.
    short_s: float = 4.0
    #: Even split at 150 % and the slow-Redis runs.
    even_s: float = 5.0
    #: Shifting (two swaps) and the Redis-stopped runs.
    long_s: float = 10.5
    burst_s: float = 6.0
    reps: int = 5
    breaker_reps: int = 3
    #: Repetitions of the 150 % runs (even, shifting, burst) and of the Redis-fault runs: one
    #: run's over-admission moves by several per cent on this machine, more than the targets.
    reps_150: int = 3
    #: Keep the burst at 100 when the rate is scaled down (a tiny burst makes every
    #: comparison hostage to scheduling jitter on a busy machine).
    keep_burst: bool = False

    @property
    def limits(self) -> Limits:
        """The one-key limit after scaling."""
        burst = BURST if self.keep_burst else max(1, round(BURST * self.factor))
        return Limits(LIMIT_RPS * self.factor, burst)

    @property
    def zipf_limits(self) -> Limits:
        """The per-key limit of the 10,000-key row (not scaled: per key, rates are small)."""
        return Limits(ZIPF_LIMIT_RPS, ZIPF_BURST)


def section(scale: Scale, mode: str, redis_url: str, **extra: Any) -> dict[str, Any]:
    """A ``rate_limit`` section for one mode."""
    lim = scale.limits
    return {"mode": mode, "redis_url": redis_url, "rate_per_s": lim.rate_per_s,
            "burst": lim.burst, "heartbeat_ms": 500, **extra}  # fmt: skip


def zipf_section(scale: Scale, redis_url: str, kind: str) -> dict[str, Any]:
    """The 10,000-key row's section (redis mode, one breaker kind)."""
    lim = scale.zipf_limits
    return {"mode": "redis", "redis_url": redis_url, "rate_per_s": lim.rate_per_s,
            "burst": lim.burst, "heartbeat_ms": 500, "breaker": {"kind": kind}}  # fmt: skip


@dataclass(frozen=True)
class Run:
    """One measured run: which pair, which load, and a label for the tables."""

    table: str
    pair: str
    scenario: str
    shape: Shape
    limits: Limits
    #: Kill Redis this many seconds into the run (the outage table).
    kill_at_s: float | None = None
    tags: dict[str, str] = field(default_factory=dict)


def shapes(scale: Scale) -> dict[str, Shape]:
    """The load shapes of table 1 (rates after scaling)."""
    rate = scale.limits.rate_per_s
    return {
        "80%": Shape(0.8 * rate, scale.short_s),
        "even": Shape(1.5 * rate, scale.even_s),
        "even-short": Shape(1.5 * rate, scale.short_s),
        "shifting": Shape(1.5 * rate, scale.long_s, split=shifting()),
        "burst": Shape(0.8 * rate, scale.burst_s, split=shifting(swap_s=3.0), boost=spikes()),
        "outage": Shape(1.5 * rate, scale.long_s),
    }


def zipf_shape(scale: Scale) -> Shape:
    """3,000 rps (scaled) over 10,000 Zipf keys."""
    return Shape(ZIPF_RPS * scale.factor, scale.short_s, key=zipf_keys(ZIPF_KEYS))
