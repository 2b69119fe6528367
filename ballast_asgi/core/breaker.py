"""Circuit breaker with a single half-open probe (pure state machine).

States and transitions (time is always passed in as ``now``)::

    closed --trip--> open --open period over--> half_open
    half_open --probe fails / probe times out--> open (period grows)
    half_open --half_open_successes probes in a row succeed--> closed

Trip (closed -> open): ``min_calls`` calls over the trailing ``window_ms`` with
``failures / calls >= failure_ratio``, or ``consecutive_failures`` in a row,
where a failure that depends on the request (5xx, timeout, reset) counts only
while failures come from at least ``min_failing_clients`` distinct client
addresses, and a failure that does not (connect error: ``shared``) always
counts (the statistics and the rule: ``core/breaker_stats.py``).

Open period of the ``n``-th trip in a row (``n = 1`` after a close)::

    open_s(n) = min(max_open_ms, open_ms * 2 ** (n - 1)) / 1000

While open, ``acquire`` returns None (the caller sheds with ``Retry-After =
retry_after_s(now)``, the remaining open time, at least 1 s). In half-open at
most one ticket (the *probe*) is out at a time, whatever the concurrency. The
probe has its own timeout ``probe_timeout_ms``: if its result has not arrived
by then, the slot is reclaimed and counted as a failed probe, so the breaker
can never stick in half-open.

A failed probe reopens the breaker when the failure is shared (connect
error), or when probes from ``min_failing_clients`` distinct clients have
failed in this half-open period. A client whose probe failed is refused
(``acquire(now, client)`` returns None) until the state changes, and the next
request from anyone else becomes the probe: one client whose own requests
fail cannot keep a recovered breaker open by always being the probe. A late result is ignored, as is
any result of a ticket issued in an earlier state (each transition starts a
new generation). Time-driven transitions are dated when they were due, not
when they were noticed, so the machine does not depend on how often it is read.
A ticket (one call's leave, settled once) is ``core/breaker_ticket.py``.

What counts as a failure is the caller's call (``ticket.record(success)``);
``is_failure_status`` applies the configured statuses (default 500, 502, 503,
504). A 4xx is a success: the upstream is healthy, the request was not.

Defaults (the ``DEFAULT_*`` constants below; ``BreakerConfig`` references
them): window 10 s, ratio 0.5 of at least 20 calls, 10 consecutive failures,
open 2 s doubling up to 15 s, 1 probe success to close, probe timeout 2 s,
failures from 3 distinct clients (``min_failing_clients = 1`` is the classic
breaker: any one caller can open it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from ballast_asgi.core.breaker_stats import TripStats, check
from ballast_asgi.core.breaker_ticket import Ticket as Ticket  # re-exported: its old home
from ballast_asgi.core.outcome import DEFAULT_FAILURE_STATUSES as _FAILURE_STATUSES

if TYPE_CHECKING:
    from ballast_asgi.core.settings import BreakerSettings


class BreakerState(enum.StrEnum):
    """The breaker's state; values are the ``state`` metric label."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


#: The states read once (an attribute of an ``Enum`` class costs ~0.1 us a read).
_CLOSED, _OPEN, _HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN

#: Called on every transition with (old state, new state, when).
TransitionListener = Callable[[BreakerState, BreakerState, float], None]

DEFAULT_WINDOW_MS = 10_000
DEFAULT_FAILURE_RATIO = 0.5
DEFAULT_MIN_CALLS = 20
DEFAULT_CONSECUTIVE_FAILURES = 10
DEFAULT_OPEN_MS = 2_000
DEFAULT_MAX_OPEN_MS = 15_000
DEFAULT_HALF_OPEN_SUCCESSES = 1
DEFAULT_PROBE_TIMEOUT_MS = 2_000
DEFAULT_FAILURE_STATUSES: tuple[int, ...] = tuple(sorted(_FAILURE_STATUSES))
#: The config's default: failures from 3 distinct clients before a 5xx can open a breaker.
DEFAULT_MIN_FAILING_CLIENTS = 3
#: A breaker is on unless the config turns it off.
DEFAULT_ENABLED = True


class Breaker:
    """Closed / open / half-open state machine; see the module docstring."""

    def __init__(
        self,
        *,
        window_ms: int = DEFAULT_WINDOW_MS,
        failure_ratio: float = DEFAULT_FAILURE_RATIO,
        min_calls: int = DEFAULT_MIN_CALLS,
        consecutive_failures: int = DEFAULT_CONSECUTIVE_FAILURES,
        open_ms: int = DEFAULT_OPEN_MS,
        max_open_ms: int = DEFAULT_MAX_OPEN_MS,
        half_open_successes: int = DEFAULT_HALF_OPEN_SUCCESSES,
        probe_timeout_ms: int = DEFAULT_PROBE_TIMEOUT_MS,
        failure_statuses: Collection[int] = DEFAULT_FAILURE_STATUSES,
        enabled: bool = DEFAULT_ENABLED,
        min_failing_clients: int = DEFAULT_MIN_FAILING_CLIENTS,
    ) -> None:
        self._stats = TripStats(
            window_ms=window_ms,
            failure_ratio=failure_ratio,
            min_calls=min_calls,
            consecutive_failures=consecutive_failures,
            min_failing_clients=min_failing_clients,
        )
        check("open_ms", 1 <= open_ms <= max_open_ms, open_ms, "in 1..max_open_ms")
        check("half_open_successes", half_open_successes >= 1, half_open_successes, ">= 1")
        check("probe_timeout_ms", probe_timeout_ms >= 1, probe_timeout_ms, ">= 1")
        statuses = sorted(failure_statuses)
        check("failure_statuses", all(500 <= x <= 599 for x in statuses), statuses, "5xx only")
        self.enabled = enabled
        self.failure_ratio = failure_ratio
        self.min_calls = min_calls
        self.consecutive_failures = consecutive_failures
        self.open_s = open_ms / 1000.0
        self.max_open_s = max_open_ms / 1000.0
        self.half_open_successes = half_open_successes
        self.probe_timeout_s = probe_timeout_ms / 1000.0
        self.failure_statuses = frozenset(failure_statuses)
        self._state = BreakerState.CLOSED
        self._since: float | None = None
        self._generation = 0
        self._trips = 0
        self._open_until = 0.0
        self._probe: Ticket | None = None
        self._probe_deadline = 0.0
        self._probe_successes = 0
        #: Clients whose probe failed in this half-open period (at most min_failing_clients).
        self._probe_failures: set[str] = set()
        self._transitions = dict.fromkeys(BreakerState, 0)
        self._listener: TransitionListener | None = None

    @classmethod
    def from_config(cls, config: BreakerSettings) -> Breaker:
        """Build from the ``breaker`` section of the gateway config."""
        return cls(
            window_ms=config.window_ms,
            failure_ratio=config.failure_ratio,
            min_calls=config.min_calls,
            consecutive_failures=config.consecutive_failures,
            open_ms=config.open_ms,
            max_open_ms=config.max_open_ms,
            half_open_successes=config.half_open_successes,
            probe_timeout_ms=config.probe_timeout_ms,
            failure_statuses=config.failure_statuses,
            enabled=config.enabled,
            min_failing_clients=config.min_failing_clients,
        )

    def set_on_transition(self, listener: TransitionListener | None) -> None:
        """Call ``listener(old, new, at)`` on every transition (e.g. to count it)."""
        self._listener = listener

    # -- asking --------------------------------------------------------------
    def acquire(self, now: float, client: str | None = None) -> Ticket | None:
        """A ticket for one call, or None: shed (open, the probe is out, or this
        client's own probe failed in this half-open period)."""
        if self._state is _CLOSED:  # ``_advance`` has nothing to do while closed
            self._since = now if self._since is None else self._since
            return Ticket(self, self._generation, False)
        self._advance(now)  # opens or half-opens, never closes
        if self._may_probe(client):
            probe = Ticket(self, self._generation, probe=True, client=client)
            self._probe = probe
            self._probe_deadline = now + self.probe_timeout_s
            return probe
        return None

    def can_acquire(self, now: float, client: str | None = None) -> bool:
        """Whether ``acquire(now, client)`` would give a ticket (takes nothing)."""
        if self._state is _CLOSED:  # ``_advance`` has nothing to do while closed
            self._since = now if self._since is None else self._since
            return True
        self._advance(now)  # opens or half-opens, never closes
        return self._may_probe(client)

    def _may_probe(self, client: str | None) -> bool:
        if self._state is not _HALF_OPEN or self._probe is not None:
            return False
        return client is None or client not in self._probe_failures

    def is_failure_status(self, status: int) -> bool:
        """Whether an upstream status counts as a failure."""
        return status in self.failure_statuses

    # -- reading -------------------------------------------------------------
    def state(self, now: float) -> BreakerState:
        """The state at ``now`` (time-driven transitions applied)."""
        self._advance(now)
        return self._state

    def seconds_in_state(self, now: float) -> float:
        """Seconds since the last transition."""
        self._advance(now)
        since = now if self._since is None else self._since
        return max(0.0, now - since)

    def retry_after_s(self, now: float) -> float:
        """Seconds a refused caller should wait: the remaining open time, at least 1."""
        self._advance(now)
        if self._state is BreakerState.OPEN:
            return max(1.0, self._open_until - now)
        return 1.0

    @property
    def transitions(self) -> dict[str, int]:
        """Transitions so far, by target state."""
        return {state.value: n for state, n in self._transitions.items()}

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON-safe state for ``/snapshot``."""
        state = self.state(now)
        return {
            "state": state.value,
            "seconds_in_state": round(self.seconds_in_state(now), 3),
            "open_remaining_s": round(max(0.0, self._open_until - now), 3)
            if state is BreakerState.OPEN
            else 0.0,
            "next_open_s": self._open_period_s(self._trips + 1),
            "consecutive_failures_to_open": self.consecutive_failures,
            "trips_in_a_row": self._trips,
            "transitions": self.transitions,
            **self._stats.snapshot(now),
            "probe_in_flight": self._probe is not None,
            "probe_failed_clients": len(self._probe_failures),
            "enabled": self.enabled,
        }

    # -- transitions ---------------------------------------------------------
    def _advance(self, now: float) -> None:
        if self._since is None:
            self._since = now
        while True:
            if self._state is _OPEN and now >= self._open_until:
                self._enter(_HALF_OPEN, self._open_until)
            elif (
                self._state is _HALF_OPEN
                and self._probe is not None
                and now >= self._probe_deadline
            ):
                probe, self._probe = self._probe, None
                if self._probe_failed(probe.client, shared=False):
                    self._enter(_OPEN, self._probe_deadline)
            else:
                return

    def _enter(self, state: BreakerState, at: float) -> None:
        old = self._state
        self._state = state
        self._since = at
        self._generation += 1
        self._transitions[state] += 1
        self._probe = None
        self._probe_successes = 0
        self._probe_failures.clear()
        if state is BreakerState.OPEN:
            self._trips += 1
            self._open_until = at + self._open_period_s(self._trips)
        elif state is BreakerState.CLOSED:
            self._trips = 0
            self._stats.clear()
        if self._listener is not None:
            self._listener(old, state, at)

    def _open_period_s(self, trips: int) -> float:
        return min(self.max_open_s, self.open_s * 2.0 ** min(trips - 1, 62))

    def _on_result(
        self, ticket: Ticket, success: bool, now: float, client: str | None, shared: bool
    ) -> None:
        if not self.enabled:
            return
        if self._state is _CLOSED:  # ``_advance`` has nothing to do while closed
            self._since = now if self._since is None else self._since
        else:
            self._advance(now)
        if ticket.generation != self._generation:
            return
        if ticket.probe:
            self._on_probe_result(ticket, success, now, client, shared)
        elif self._state is _CLOSED and self._stats.record(
            success, now, client=client, shared=shared
        ):
            self._enter(_OPEN, now)

    def _on_probe_result(
        self, ticket: Ticket, success: bool, now: float, client: str | None, shared: bool
    ) -> None:
        if self._probe is not ticket:
            return
        self._probe = None
        if not success:
            if self._probe_failed(client if client is not None else ticket.client, shared):
                self._enter(BreakerState.OPEN, now)
            return
        self._probe_successes += 1
        if self._probe_successes >= self.half_open_successes:
            self._enter(BreakerState.CLOSED, now)

    def _probe_failed(self, client: str | None, shared: bool) -> bool:
        """Note a failed probe; True when it reopens the breaker (see the module docstring)."""
        if shared or self._stats.min_failing_clients <= 1:
            return True
        self._probe_failures.add(client or "")
        return len(self._probe_failures) >= self._stats.min_failing_clients

    def _on_cancel(self, ticket: Ticket) -> None:
        if ticket.probe and self._probe is ticket:
            self._probe = None
