"""How one upstream attempt ended, what that means to each policy, and why a request was shed.

``AttemptOutcome`` is recorded exactly once per attempt, by whatever produced the
response (the proxy, or the in-app stack around a handler). Pure functions map it
to the limiter's signal (``Outcome``), the breaker's verdict and retryability, so
no stage re-derives it from strings, statuses or exceptions.

``ShedReason`` values are the ``reason`` label of ``ballast_shed_total`` and the
``X-Ballast-Reason`` header: a closed set, so the metric's cardinality is bounded.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping


class Outcome(enum.Enum):
    """What a released permit tells the limit algorithm."""

    #: Members are singletons compared by identity: hash them by identity too, in C
    #: (``Enum.__hash__`` is a Python call, ~0.2 us per dict or set lookup on 3.11).
    __hash__ = object.__hash__

    #: The upstream answered in time; the round trip is an RTT sample.
    SUCCESS = "success"
    #: Timeout, 5xx, deadline miss: a congestion signal, not an RTT sample.
    DROPPED = "dropped"
    #: Client gone, shed downstream: no sample at all.
    IGNORED = "ignored"


class ShedReason(enum.StrEnum):
    """Why a request was refused without (further) upstream work."""

    DEADLINE = "deadline"
    EARLY_DROP = "early_drop"
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    LIMIT = "limit"
    CAPACITY = "capacity"
    BREAKER_OPEN = "breaker_open"
    RATE_LIMITED = "rate_limited"


#: Sheds that mean "the upstream is unavailable", not "you send too much": 503 by default.
UNAVAILABLE_REASONS = frozenset({ShedReason.BREAKER_OPEN})
#: The default status of an unavailability shed (every other shed: the overload status, 429).
UNAVAILABLE_STATUS = 503
#: The default status of an overload shed.
OVERLOAD_STATUS = 429


def shed_statuses(
    overload_status: int = OVERLOAD_STATUS, by_reason: Mapping[ShedReason, int] | None = None
) -> dict[ShedReason, int]:
    """Every shed reason's response status: ``by_reason``, else 503 (unavailable) or overload."""
    out = {
        r: UNAVAILABLE_STATUS if r in UNAVAILABLE_REASONS else overload_status for r in ShedReason
    }
    out.update(by_reason or {})
    return out


class AttemptOutcome(enum.Enum):
    """How one attempt at the upstream (or the app's handler) ended."""

    #: Members are singletons compared by identity: hash them by identity too, in C
    #: (``Enum.__hash__`` is a Python call, ~0.2 us per dict or set lookup on 3.11).
    __hash__ = object.__hash__

    #: A response head arrived with a status that is not a failure.
    SUCCESS = "success"
    #: The upstream answered with a failure status (5xx by default).
    STATUS_5XX = "status_5xx"
    #: The upstream did not answer within the gateway's own upstream timeout.
    TIMEOUT = "timeout"
    #: The request's own deadline (``X-Deadline-Ms``) ran out: not the upstream's fault.
    DEADLINE = "deadline"
    #: The connection could not be made (refused, DNS, TLS, pool connect timeout).
    CONNECT_ERROR = "connect_error"
    #: Reset, truncated or malformed response after the connection was made.
    PROTOCOL_ERROR = "protocol_error"
    #: The client went away before the response completed.
    CLIENT_GONE = "client_gone"
    #: The gateway refused or failed on its own (bad target, bug): counts as nothing.
    GATEWAY_ERROR = "gateway_error"


class Verdict(enum.Enum):
    """What an attempt tells the circuit breaker."""

    #: Members are singletons compared by identity: hash them by identity too, in C
    #: (``Enum.__hash__`` is a Python call, ~0.2 us per dict or set lookup on 3.11).
    __hash__ = object.__hash__

    SUCCESS = "success"
    FAILURE = "failure"
    NEUTRAL = "neutral"


_LIMITER = {
    AttemptOutcome.SUCCESS: Outcome.SUCCESS,
    AttemptOutcome.STATUS_5XX: Outcome.DROPPED,
    AttemptOutcome.TIMEOUT: Outcome.DROPPED,
    AttemptOutcome.DEADLINE: Outcome.DROPPED,
    AttemptOutcome.CONNECT_ERROR: Outcome.DROPPED,
    AttemptOutcome.PROTOCOL_ERROR: Outcome.DROPPED,
    AttemptOutcome.CLIENT_GONE: Outcome.IGNORED,
    AttemptOutcome.GATEWAY_ERROR: Outcome.IGNORED,
}

_BREAKER = {
    AttemptOutcome.SUCCESS: Verdict.SUCCESS,
    AttemptOutcome.STATUS_5XX: Verdict.FAILURE,
    AttemptOutcome.TIMEOUT: Verdict.FAILURE,
    AttemptOutcome.DEADLINE: Verdict.NEUTRAL,
    AttemptOutcome.CONNECT_ERROR: Verdict.FAILURE,
    AttemptOutcome.PROTOCOL_ERROR: Verdict.FAILURE,
    AttemptOutcome.CLIENT_GONE: Verdict.NEUTRAL,
    AttemptOutcome.GATEWAY_ERROR: Verdict.NEUTRAL,
}

#: Outcomes a retry may replace (before the commit point, inside the deadline, from the budget).
RETRYABLE = frozenset(
    {
        AttemptOutcome.STATUS_5XX,
        AttemptOutcome.TIMEOUT,
        AttemptOutcome.CONNECT_ERROR,
        AttemptOutcome.PROTOCOL_ERROR,
    }
)


#: Upstream statuses worth another attempt by default (``RetryConfig.retry_statuses``).
DEFAULT_RETRY_STATUSES = (502, 503, 504)


def limiter_signal(outcome: AttemptOutcome) -> Outcome:
    """What the limiter records for a permit whose (last) attempt ended so."""
    return _LIMITER[outcome]


def breaker_verdict(outcome: AttemptOutcome) -> Verdict:
    """What the breaker counts for an attempt that ended so."""
    return _BREAKER[outcome]


def is_retryable(outcome: AttemptOutcome) -> bool:
    """Whether a retry may replace an attempt that ended so."""
    return outcome in RETRYABLE


#: The statuses a response head counts as a failure when no config says otherwise.
DEFAULT_FAILURE_STATUSES: frozenset[int] = frozenset({500, 502, 503, 504})


#: Read once: an attribute of an ``Enum`` class costs ~0.12 us a read on Python 3.11.
_STATUS_5XX = AttemptOutcome.STATUS_5XX
_SUCCESS = AttemptOutcome.SUCCESS


def status_outcome(status: int, failure_statuses: frozenset[int]) -> AttemptOutcome:
    """The outcome of an attempt whose response head carried ``status``."""
    return _STATUS_5XX if status in failure_statuses else _SUCCESS
