"""The event loop the tools drive load from."""

from __future__ import annotations

import time

import uvloop


class HiResLoop(uvloop.Loop):  # type: ignore[misc,unused-ignore]
    """uvloop whose ``time()`` is ``time.monotonic()``.

    uvloop's own ``loop.time()`` is libuv's cached millisecond clock, so loadgen's
    latencies (taken from ``loop.time()``) would be whole milliseconds; the added
    latency of a proxy is a fraction of one. Timers still fire on libuv's
    millisecond clock, so a request may leave up to ~1 ms before its intended
    time (recorded as zero lag); that bias is the same for every configuration.
    """

    def time(self) -> float:
        """High-resolution monotonic seconds."""
        return time.monotonic()
