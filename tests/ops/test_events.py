"""Operator events: one structured line per state change, rate-limited per (event, key)."""

from __future__ import annotations

import json
import logging

import pytest

from ballast_asgi.telemetry.events import EventLog, JsonFormatter, TextFormatter, formatter
from tests.fakes import FakeClock


def _log(clock: FakeClock) -> tuple[EventLog, list[logging.LogRecord]]:
    logger = logging.getLogger("ballast.events.test")
    logger.handlers.clear()
    logger.propagate = False
    logger.setLevel(logging.INFO)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger.addHandler(Keep())
    return EventLog(clock=clock, burst=2, refill_s=10.0, logger=logger, _ready=True), records


def test_burst_then_suppressed_then_counted() -> None:
    """Two lines pass, the next are counted; after a refill the next line says how many."""
    clock = FakeClock(0.0)
    log, records = _log(clock)
    assert [log.emit("upstream.connect_refused", key="a", n=i) for i in range(5)] == [
        True, True, False, False, False]  # fmt: skip
    assert log.emit("upstream.connect_refused", key="b")  # another key has its own bucket
    clock.advance(10.0)
    assert log.emit("upstream.connect_refused", key="a", n=5)
    assert records[-1].ballast_fields == {"n": 5, "suppressed": 3}  # type: ignore[attr-defined]
    assert len(records) == 4


def test_levels_below_the_logger_level_are_dropped_without_spending() -> None:
    """A debug event under an INFO logger writes nothing and keeps the bucket full."""
    clock = FakeClock(0.0)
    log, records = _log(clock)
    assert not log.emit("x", "debug")
    assert log.emit("x", "info") and log.emit("x", "info") and records[0].levelname == "INFO"


def test_text_and_json_lines() -> None:
    """Text: time, level, event, k=v (quoted when needed); JSON: one object per line."""
    clock = FakeClock(0.0)
    log, records = _log(clock)
    log.emit("breaker.open", "warning", scope="gateway", failure_ratio=0.5123456, why="a b")
    text = TextFormatter().format(records[0])
    assert text.endswith(' WARNING breaker.open scope=gateway failure_ratio=0.512346 why="a b"')
    doc = json.loads(JsonFormatter().format(records[0]))
    assert doc["level"] == "warning" and doc["event"] == "breaker.open"
    assert doc["failure_ratio"] == 0.5123456 and doc["ts"].endswith("Z")


def test_unknown_format_names_the_choices() -> None:
    """A bad format is a ValueError listing text and json."""
    with pytest.raises(ValueError, match="text, json"):
        formatter("xml")
