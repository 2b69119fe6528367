"""The limiter's recent-traffic estimators, bucketed over a sliding window (pure).

``RateWindow`` counts events per second over the last ``window_s`` (the
limiter's ``throughput_rps``); ``WindowedMin`` keeps the minimum over the last
``window_s`` (the limiter's ``rtt_min_s``, early drop's "minimum service
time"). Both keep ten buckets of ``window_s / 10`` and take ``now`` as an
argument.
"""

from __future__ import annotations

from collections import deque


class RateWindow:
    """Events per second over the last ``window_s``, in ten buckets."""

    def __init__(self, window_s: float) -> None:
        self.bucket_s = window_s / 10.0
        self.window_s = window_s
        self._buckets: deque[list[int]] = deque()
        self._first: float | None = None

    def add(self, now: float) -> None:
        idx = int(now / self.bucket_s)
        buckets = self._buckets
        if buckets:
            last = buckets[-1]
            if last[0] == idx:  # the bucket of the last add: trimmed at this index already
                last[1] += 1
                return
        elif self._first is None:
            self._first = now
        buckets.append([idx, 1])
        self._trim(idx)

    def _trim(self, idx: int) -> None:
        while self._buckets and self._buckets[0][0] <= idx - 10:
            self._buckets.popleft()

    def rate(self, now: float) -> float:
        if self._first is None:
            return 0.0
        self._trim(int(now / self.bucket_s))
        span = min(self.window_s, max(now - self._first, self.bucket_s))
        return sum(count for _, count in self._buckets) / span


class WindowedMin:
    """Minimum over the last ``window_s``, kept per ``window_s / 10`` bucket."""

    def __init__(self, window_s: float) -> None:
        self.bucket_s = window_s / 10.0
        self._buckets: deque[list[float]] = deque()

    def add(self, value: float, now: float) -> None:
        idx = float(int(now / self.bucket_s))
        buckets = self._buckets
        if buckets:
            last = buckets[-1]
            if last[0] == idx:  # the bucket of the last add: trimmed at this index already
                if value < last[1]:  # ``min(last[1], value)``
                    last[1] = value
                return
        buckets.append([idx, value])
        while buckets and buckets[0][0] <= idx - 10:
            buckets.popleft()

    def value(self) -> float | None:
        return min((v for _, v in self._buckets), default=None)
