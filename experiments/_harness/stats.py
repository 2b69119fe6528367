"""Small statistics for the reports: nearest-rank percentile, median, median with range."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (0..100) of a list, 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100.0 * len(ordered)))]


def median(values: Iterable[float | None]) -> float:
    """Median of the finite values, NaN when there are none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def spread(values: Iterable[float | None]) -> tuple[float, float, float]:
    """(median, lowest, highest) of the finite values; NaNs when there are none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return math.nan, math.nan, math.nan
    return statistics.median(finite), min(finite), max(finite)
