"""The soak's arithmetic: RSS growth after warm-up and its least-squares slope."""

from __future__ import annotations

from typing import Any

GROWTH_TARGET_PCT = 5.0


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(t_s, value)`` points, in value units per minute."""
    if len(points) < 2:
        return None
    n = len(points)
    t_mean = sum(t for t, _ in points) / n
    v_mean = sum(v for _, v in points) / n
    var = sum((t - t_mean) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - t_mean) * (v - v_mean) for t, v in points)
    return cov / var * 60.0


def rss_summary(samples: list[list[float]], warmup_s: float) -> dict[str, Any]:
    """RSS at warm-up end, at the end, max, growth % and slope from ``[t_s, rss_mb]`` rows."""
    after = [(t, r) for t, r in samples if t >= warmup_s]
    if not after:
        raise RuntimeError(f"no RSS sample after the {warmup_s:g} s warm-up")
    warm_t, warm_mb = after[0]
    end_t, end_mb = after[-1]
    growth = 100.0 * (end_mb - warm_mb) / warm_mb
    slope = slope_per_min(after)
    return {
        "warm_t_s": warm_t,
        "warm_mb": round(warm_mb, 2),
        "end_t_s": end_t,
        "end_mb": round(end_mb, 2),
        "max_mb": round(max(r for _, r in samples), 2),
        "growth_pct": round(growth, 2),
        "slope_mb_per_min": None if slope is None else round(slope, 4),
        "target_met": growth <= GROWTH_TARGET_PCT,
    }
