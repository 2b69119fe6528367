"""Hot-path counters (issue 31): the bound increments count what ``Counter.inc`` counts."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from ballast_asgi.core.outcome import ShedReason
from ballast_asgi.core.priority import ALL_PRIORITIES, Priority
from ballast_asgi.telemetry.metrics import _adder, null_metrics


def test_count_shed_and_count_request_show_in_the_exposition() -> None:
    """Every shed and request counted through the bound increments is in the scrape."""
    metrics = null_metrics()
    for _ in range(3):
        metrics.count_shed(ShedReason.DEADLINE, Priority.CRITICAL)
    metrics.count_request(Priority.BULK)
    metrics.count_request(Priority.BULK)
    text = metrics.exposition().decode()
    assert 'ballast_shed_total{priority="critical",reason="deadline"} 3.0' in text
    assert 'ballast_requests_total{priority="bulk"} 2.0' in text
    assert 'ballast_requests_total{priority="standard"} 0.0' in text


def test_every_reason_and_tier_has_its_own_increment() -> None:
    """Each (reason, tier) increments its own child and no other."""
    metrics = null_metrics()
    for reason in ShedReason:
        for priority in ALL_PRIORITIES:
            metrics.count_shed(reason, priority)
    for child in metrics._shed.values():
        assert child._value.get() == 1.0


def test_adder_falls_back_to_inc_for_a_child_without_a_value() -> None:
    """A counter child whose value object has no ``inc`` is counted through ``inc``."""
    counter = Counter("c", "c", registry=CollectorRegistry())
    counter._value = object()  # type: ignore[assignment]
    seen: list[float] = []
    counter.inc = seen.append  # type: ignore[method-assign,assignment]
    _adder(counter)(1)
    assert seen == [1]
