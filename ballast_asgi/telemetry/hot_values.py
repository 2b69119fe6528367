"""Metric values the request path adds to without taking a lock (issue 31, ADR 0021).

prometheus_client keeps each counter's and histogram's numbers in a ``MutexValue``,
a float behind a ``threading.Lock`` taken on every ``inc``; a histogram's
``observe`` is a Python loop over its buckets on top. Every proxied request pays
three of those additions and one such loop (the request counter, the upstream
latency's sum and bucket), every shed two additions.

``HotValue`` has ``MutexValue``'s API (``inc``, ``set``, ``get`` and the exemplar
pair) on a plain float, and ``HistogramObserver`` observes into a histogram's
values directly. Compiled (this module is in ``native.MODULES``), an addition is a
C statement run while holding the GIL, which no other thread can split; on the
sources it would be three bytecodes a thread switch can, so ``make_hot`` and
``observer`` swap nothing unless the build is in use (``native.active()``): the
sources keep prometheus_client's own values and ``observe``. Scrapes read the same
numbers either way (``get``), from any thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client.values import MutexValue

from ballast_asgi.core import native


class HotValue:
    """A counter's or a histogram part's number, ``MutexValue``'s API without the lock."""

    def __init__(self, value: float = 0.0) -> None:
        self._value = value
        self._exemplar: object = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: object) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> object:
        return self._exemplar


class HistogramObserver:
    """``histogram.observe(amount)`` into its values (made ``HotValue``s), no exemplar."""

    def __init__(self, histogram: Any) -> None:
        self._sum = histogram._sum = _as_hot(histogram._sum)
        self._bounds: list[float] = [float(b) for b in histogram._upper_bounds]
        self._buckets: list[HotValue] = [_as_hot(b) for b in histogram._buckets]
        histogram._buckets[:] = self._buckets

    def __call__(self, amount: float) -> None:
        self._sum.inc(amount)
        bounds = self._bounds
        for i in range(len(bounds)):
            if amount <= bounds[i]:
                self._buckets[i].inc(1.0)
                return


def _as_hot(value: Any) -> HotValue:
    """``value`` as a ``HotValue`` holding its number (itself when it is one already)."""
    return value if isinstance(value, HotValue) else HotValue(value.get())


def _swappable(value: object) -> bool:
    """prometheus_client's single-process value (a multiprocess one is left alone)."""
    return isinstance(value, MutexValue)


def make_hot(child: Any) -> None:
    """A counter child's value made a ``HotValue`` (when compiled; else left as it is)."""
    if native.active() and _swappable(getattr(child, "_value", None)):
        child._value = _as_hot(child._value)


def observer(histogram: Any) -> Callable[[float], None]:
    """What observes into ``histogram`` (a child without labels): a ``HistogramObserver``
    when compiled and the histogram is prometheus_client's single-process one, else its
    own ``observe``."""
    parts = (getattr(histogram, "_sum", None), *getattr(histogram, "_buckets", [None]))
    known = hasattr(histogram, "_upper_bounds") and all(_swappable(p) for p in parts)
    if native.active() and known:
        return HistogramObserver(histogram)
    observe: Callable[[float], None] = histogram.observe
    return observe


__all__ = ["HistogramObserver", "HotValue", "make_hot", "observer"]
