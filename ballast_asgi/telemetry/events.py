"""Operator events: one structured log line per state change, rate-limited, never per request.

``emit(event, level, key=..., **fields)`` writes one line on the
``ballast.events`` logger: the level, the event name (``pool.instance_ejected``,
``breaker.open``, ``ratelimit.redis_lost`` ...; docs/operations.md lists them
all with an example line) and the numbers that explain it as ``key=value``
fields. Two formats, chosen by ``--log-format`` or ``BALLAST_LOG_FORMAT``::

    2026-12-03T08:40:01.123Z WARNING pool.instance_ejected instance=http://10.0.0.7:80 ...
    {"ts": "2026-12-03T08:40:01.123Z", "level": "warning", "event": "breaker.open", ...}

**Rate limit.** Each (event, key) pair has a token bucket of ``BURST`` lines
(default 5) refilled at one line per ``REFILL_S`` (default 10 s); a line over
the budget is counted, not written, and the next line written for that pair
carries ``suppressed=N``. Callers emit on state changes only; the one event
raised on a request path (``upstream.connect_refused``) relies on the bucket.

**Where it goes.** When the process has configured no logging of its own
(root logger without handlers: the ``ballast`` CLI, ``uvicorn
ballast_asgi.gateway:app``), the first line installs a stderr handler on
``ballast.events`` (level INFO, so recoveries show beside failures) and stops
propagation; inside an app that configured logging, lines propagate to its
handlers and its levels rule. ``configure`` sets the format and level
explicitly (the CLI calls it). The clock is injectable for tests.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["LOGGER", "EventLog", "configure", "emit", "events"]

LOGGER = "ballast.events"
BURST = 5
REFILL_S = 10.0
Level = Literal["debug", "info", "warning", "error"]
FORMATS = ("text", "json")
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}  # fmt: skip


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    suppressed: int = 0


@dataclass
class EventLog:
    """Rate-limited structured events on one logger (one per process: ``events``)."""

    clock: Callable[[], float] = time.monotonic
    burst: int = BURST
    refill_s: float = REFILL_S
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger(LOGGER))
    _buckets: dict[tuple[str, str], _Bucket] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ready: bool = False

    def emit(self, event: str, level: str = "warning", *, key: str = "", **fields: Any) -> bool:
        """Log ``event`` unless its (event, key) bucket is empty; True when written."""
        if not self._ready:
            self._ready = True
            _auto_configure(self.logger)
        number = _LEVELS.get(level, logging.WARNING)
        if not self.logger.isEnabledFor(number):
            return False
        suppressed = self._take(event, key)
        if suppressed is None:
            return False
        if suppressed:
            fields["suppressed"] = suppressed
        self.logger.log(number, "%s %s", event, _pairs(fields),
                        extra={"ballast_event": event, "ballast_fields": fields})  # fmt: skip
        return True

    def _take(self, event: str, key: str) -> int | None:
        """Spend one token: the count suppressed since the last line, or None when empty."""
        now = self.clock()
        with self._lock:
            b = self._buckets.get((event, key))
            if b is None:
                b = self._buckets[(event, key)] = _Bucket(float(self.burst), now)
            b.tokens = min(float(self.burst), b.tokens + (now - b.at) / self.refill_s)
            b.at = now
            if b.tokens < 1.0:
                b.suppressed += 1
                return None
            b.tokens -= 1.0
            out, b.suppressed = b.suppressed, 0
            return out

    def reset(self) -> None:
        """Forget every bucket (tests; a new process after fork starts full anyway)."""
        with self._lock:
            self._buckets.clear()


def _pairs(fields: dict[str, Any]) -> str:
    return " ".join(f"{k}={_text(v)}" for k, v in fields.items())


def _text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    s = str(value)
    return json.dumps(s) if (not s or any(c in s for c in ' "=\n')) else s


def _stamp(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + (
        f".{int(created % 1 * 1000):03d}Z"
    )


class TextFormatter(logging.Formatter):
    """``<UTC time> <LEVEL> <event> k=v ...``."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{_stamp(record.created)} {record.levelname} {record.getMessage()}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, event, then the fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"ts": _stamp(record.created), "level": record.levelname.lower()}
        event = getattr(record, "ballast_event", None)
        if event is None:
            doc["message"] = record.getMessage()
        else:
            doc["event"] = event
            doc.update(getattr(record, "ballast_fields", {}))
        return json.dumps(doc, default=str)


def formatter(fmt: str) -> logging.Formatter:
    """The formatter of ``fmt`` (``text`` or ``json``), else ValueError naming the choices."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure(fmt: str | None = None, level: str = "info") -> None:
    """Write events to stderr in ``fmt`` (default ``BALLAST_LOG_FORMAT`` or text) at ``level``."""
    fmt = fmt or os.environ.get("BALLAST_LOG_FORMAT") or "text"
    log = logging.getLogger(LOGGER)
    for handler in [h for h in log.handlers if getattr(h, "_ballast", False)]:
        log.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler._ballast = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(_LEVELS.get(level.lower(), logging.INFO))
    log.propagate = False
    events._ready = True


def _auto_configure(log: logging.Logger) -> None:
    if log.handlers or logging.getLogger().handlers:
        if log.level == logging.NOTSET:
            log.setLevel(logging.INFO)
        return
    try:
        configure()
    except ValueError:  # a bad BALLAST_LOG_FORMAT (the CLI refuses it at start-up)
        configure("text")


#: The process's event log.
events = EventLog()
emit = events.emit
