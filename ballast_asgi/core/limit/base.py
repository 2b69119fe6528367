"""The limit-algorithm interface: samples in, a concurrency limit out.

A limit algorithm never enforces anything (that is ``ballast_asgi.core.limiter``);
it only turns completed-request samples into a number. Every algorithm is pure:
time arrives as ``now`` (monotonic seconds) and randomness, where used, as an
injected ``random.Random``.

A ``Sample`` describes one request that held a permit:

* ``start``: monotonic time the permit was acquired;
* ``rtt_s``: seconds from acquire to release;
* ``inflight_at_start``: permits held right after this one was acquired
  (this request included), the "is the limit binding?" signal;
* ``dropped``: the request timed out, got a 5xx or missed its deadline, a
  congestion signal rather than an RTT measurement;
* ``limit_at_start``: the limit in force when the permit was acquired (0 when
  unknown): "was it binding?" must compare with the limit of that moment, not
  with one that has grown since (slow start doubles the limit per RTT);
* ``lag_s``: the gateway's own event-loop lag estimated when the sample was
  taken (``ballast_asgi.core.loop_lag``, 0 when not measured): part of
  ``rtt_s`` that the response spent waiting for the gateway, not the backend.
  Delay-based algorithms use ``backend_rtt_s`` (ADR 0010);
* ``route``: the request's route key (``""``: unknown, one route for all), so
  an algorithm can judge each sample against its own route's latency (ADR 0016).

Requests released as ``Outcome.IGNORED`` (client gone, shed downstream) and
requests that were refused never become samples.

Contract (checked for every algorithm by ``tests/core/test_limits.py``):

1. ``min_limit <= limit <= max_limit`` after any sample sequence;
2. a run of dropped samples never raises the limit;
3. samples with ``inflight_at_start < limit / 2`` (the limit is not binding)
   never raise the limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

#: RTTs are floored at one microsecond so ratios never divide by zero.
MIN_RTT_S = 1e-6

#: Defaults of the bounds every adaptive algorithm takes (``LimiterConfig``
#: references them): start at 20, never below 4 nor above 1000.
DEFAULT_INITIAL_LIMIT = 20
DEFAULT_MIN_LIMIT = 4
DEFAULT_MAX_LIMIT = 1000
#: Default sampling window of the windowed algorithm (``gradient``), milliseconds.
DEFAULT_WINDOW_MS = 500


@dataclass(frozen=True, slots=True)
class Sample:
    """One completed request, as the limit algorithm sees it."""

    start: float
    rtt_s: float
    inflight_at_start: int
    dropped: bool = False
    limit_at_start: int = 0
    lag_s: float = 0.0
    route: str = ""

    @property
    def backend_rtt_s(self) -> float:
        """``rtt_s`` without the gateway's loop lag (floored at ``MIN_RTT_S``)."""
        rtt = self.rtt_s - self.lag_s
        return rtt if rtt > MIN_RTT_S else MIN_RTT_S

    def started_at_limit(self, limit: float, ratio: float) -> bool:
        """True when in-flight was at ``ratio`` of the limit in force at the start.

        ``limit`` (the current one) stands in when ``limit_at_start`` is unknown;
        the smaller of the two is used, so a limit that fell since still counts.
        """
        then = min(self.limit_at_start, int(limit)) if self.limit_at_start else int(limit)
        return self.inflight_at_start >= ratio * then


@runtime_checkable
class LimitAlgorithm(Protocol):
    """Turns samples into a concurrency limit."""

    #: Registry name, e.g. ``"gradient"``.
    name: str

    @property
    def limit(self) -> int:
        """The current limit (an integer within the algorithm's bounds)."""
        ...

    def on_sample(self, sample: Sample, now: float) -> int:
        """Take one sample; return the (possibly new) limit."""
        ...

    def snapshot(self) -> dict[str, object]:
        """Algorithm state as JSON-safe values (for ``/snapshot``)."""
        ...


#: ``on_result(start, rtt_s, inflight_at_start, dropped, limit_at_start, lag_s, route, now)``:
#: ``on_sample(Sample(start, ...), now)`` without building the ``Sample``.
ResultFeed = Callable[[float, float, int, bool, int, float, str, float], int]


#: ``on_sample`` methods that only unpack their ``Sample`` into ``on_result``.
_UNPACKING: list[object] = []


def unpacks_into_on_result(on_sample: object) -> None:
    """Declare ``on_sample`` (a class's, ``Cls.on_sample``) an unpacking into ``on_result``.

    Called after the class statement rather than as a class attribute or a class
    decorator: a core compiled with mypyc (ADR 0021) allows neither."""
    if on_sample not in _UNPACKING:
        _UNPACKING.append(on_sample)


def result_feed(algorithm: object) -> ResultFeed | None:
    """The algorithm's ``on_result`` when its ``on_sample`` only unpacks the sample into it.

    The limiter feeds each release to it directly, saving the ``Sample`` (a frozen
    dataclass: the costliest object of a release). An algorithm says so with
    ``unpacks_into_on_result(Cls.on_sample)``; a subclass that overrides
    ``on_sample`` has another ``on_sample`` and is fed ``Sample`` objects again.
    """
    on_sample = getattr(type(algorithm), "on_sample", None)
    if not any(on_sample is known for known in _UNPACKING):
        return None
    feed: ResultFeed = algorithm.on_result  # type: ignore[attr-defined]
    return feed


def check_bounds(initial_limit: float, min_limit: int, max_limit: int, *, prefix: str = "") -> None:
    """Raise ``ValueError`` naming the parameter unless 1 <= min <= initial <= max.

    ``prefix`` goes before each name (``LimiterConfig`` passes ``"limiter."``).
    """
    p = prefix
    if min_limit < 1:
        raise ValueError(f"{p}min_limit must be >= 1, got {min_limit}")
    if max_limit < min_limit:
        raise ValueError(f"{p}min_limit ({min_limit}) must be <= {p}max_limit ({max_limit})")
    if not min_limit <= initial_limit <= max_limit:
        raise ValueError(
            f"{p}initial_limit ({initial_limit}) must be within "
            f"[min_limit, max_limit] = [{min_limit}, {max_limit}]"
        )


def clamp(value: float, low: float, high: float) -> float:
    """``value`` limited to ``[low, high]``."""
    return low if value < low else high if value > high else value


def log10_root(limit: float) -> float:
    """``max(1, floor(log10(limit)))``: the Vegas step size (Netflix ``Log10RootFunction``)."""
    return float(max(1, int(math.log10(max(limit, 1.0)))))
