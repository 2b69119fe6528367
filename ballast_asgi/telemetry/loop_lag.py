"""The driver of ``core.loop_lag``: a periodic tick on the running event loop.

``LoopLagMonitor()`` is the limiter's ``loop_lag`` source (``build_parts``
passes it when ``limiter.subtract_loop_lag`` is on). It starts lazily: the
first reading made inside a running event loop schedules a callback every
``period_s`` with ``loop.call_later`` (no task, nothing to await or cancel
on shutdown) and records how late each one ran in a ``LoopLag``. A reading
from another loop (tests run one per test) starts afresh on that loop;
outside any loop the reading is 0. Costs one short callback per period.

A reading is every request's (``Limiter._release``), so the loop it started on
is recognised without ``asyncio.get_running_loop``, which makes a ``getpid``
system call on every call in CPython 3.11: that loop running, on the thread it
was started from, is the running loop (a thread runs one loop at a time).
"""

from __future__ import annotations

import asyncio
import time
from threading import get_ident

from ballast_asgi.core.loop_lag import DEFAULT_ALPHA, DEFAULT_PERIOD_S, LoopLag
from ballast_asgi.core.types import Clock


class LoopLagMonitor:
    """Seconds of event-loop lag now; callable, so it plugs into ``Limiter(loop_lag=...)``."""

    def __init__(
        self,
        period_s: float = DEFAULT_PERIOD_S,
        alpha: float = DEFAULT_ALPHA,
        clock: Clock = time.monotonic,
    ) -> None:
        self.lag = LoopLag(period_s, alpha)
        self.clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owner_thread = 0
        self._handle: asyncio.TimerHandle | None = None

    def __call__(self) -> float:
        """The lag estimate now (0 outside a running loop; the first call starts the tick)."""
        loop = self._loop
        if loop is None or not loop.is_running() or get_ident() != self._owner_thread:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return 0.0
            if loop is not self._loop:
                self._start(loop)
        return self.lag.estimate(self.clock())

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.stop()
        self._loop = loop
        self._owner_thread = get_ident()
        self.lag = LoopLag(self.lag.period_s, self.lag.alpha)
        self._tick()

    def _tick(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        self.lag.tick(self.clock())
        self._handle = loop.call_later(self.lag.period_s, self._tick)

    def stop(self) -> None:
        """Cancel the tick (it starts again at the next reading inside a loop)."""
        handle, self._handle, self._loop = self._handle, None, None
        if handle is not None:
            handle.cancel()
