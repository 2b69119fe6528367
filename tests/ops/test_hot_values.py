"""Lock-free metric values (``telemetry/hot_values.py``): the same numbers in the scrape."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, values
from prometheus_client.exposition import generate_latest

from ballast_asgi.core import native
from ballast_asgi.core.priority import Priority
from ballast_asgi.telemetry.hot_values import HistogramObserver, HotValue, make_hot, observer
from ballast_asgi.telemetry.metrics import LATENCY_BUCKETS, null_metrics

AMOUNTS = st.lists(
    st.one_of(st.floats(-1.0, 40.0, allow_nan=False), st.sampled_from(LATENCY_BUCKETS)),
    max_size=60,
)


def test_a_hot_value_answers_as_a_mutex_value() -> None:
    """``inc``, ``set``, ``get`` and the exemplar pair: ``MutexValue``'s answers."""
    mutex: Any = values.MutexValue  # untyped in prometheus_client
    hot, mutex = HotValue(), mutex("counter", "m", "m", (), (), "h")
    for value in (hot, mutex):
        value.inc(2)
        value.inc(0.5)
    assert hot.get() == mutex.get() == 2.5
    for value in (hot, mutex):
        value.set(7.0)
        value.set_exemplar("e")
    assert hot.get() == mutex.get() == 7.0
    assert hot.get_exemplar() == mutex.get_exemplar() == "e"


@given(AMOUNTS)
def test_the_observer_scrapes_as_observe(amounts: list[float]) -> None:
    """Observed through ``HistogramObserver``, a histogram's exposition is byte for byte
    what ``Histogram.observe`` gives (bucket edges, below zero and past the last bound)."""
    scrapes = []
    for hot in (False, True):
        registry = CollectorRegistry()
        histogram = Histogram("h_seconds", "h", buckets=LATENCY_BUCKETS, registry=registry)
        histogram._created = 0.0  # the creation time is the only other difference
        observe = HistogramObserver(histogram) if hot else histogram.observe
        for amount in amounts:
            observe(amount)
        scrapes.append(generate_latest(registry))
    assert scrapes[0] == scrapes[1]


def test_values_are_swapped_only_with_the_build_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the sources a thread switch could split an unlocked addition: nothing is swapped
    and ``observer`` is the histogram's own ``observe``."""
    monkeypatch.setattr(native, "_active", False)
    counter = Counter("c", "c", registry=CollectorRegistry())
    make_hot(counter)
    assert isinstance(counter._value, values.MutexValue)
    histogram = Histogram("h", "h", registry=CollectorRegistry())
    assert observer(histogram) == histogram.observe
    monkeypatch.setattr(native, "_active", True)
    make_hot(counter)
    counter.inc(3)
    value: Any = counter._value
    assert isinstance(value, HotValue) and value.get() == 3.0
    observe = observer(histogram)
    assert isinstance(observe, HistogramObserver)
    observe(0.2)
    total: Any = histogram._sum
    assert total.get() == 0.2


def test_a_labelled_parent_keeps_its_own_observe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A histogram with labels has no values of its own: ``observe`` (which refuses)."""
    monkeypatch.setattr(native, "_active", True)
    parent = Histogram("h", "h", ["tier"], registry=CollectorRegistry())
    assert observer(parent) == parent.observe


def test_the_gateway_s_counts_are_the_same_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """The metrics object counts and observes the same with and without the swap."""
    texts = []
    for active in (False, True):
        monkeypatch.setattr(native, "_active", active)
        metrics = null_metrics()
        metrics.count_request(Priority.CRITICAL)
        metrics.count_queued("admitted")
        metrics.count_retry("denied")
        metrics.observe_queue_wait(Priority.BULK, 0.03)
        metrics.observe_upstream_latency(0.004)
        metrics.observe_upstream_latency(0.4)
        lines = [
            line
            for line in metrics.exposition().decode().splitlines()
            if not line.startswith("#") and "_created" not in line
        ]
        texts.append(lines)
    assert texts[0] == texts[1]
