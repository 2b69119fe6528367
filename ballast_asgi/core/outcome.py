"""How a request ended, as seen by the limiter, and why a request was shed.

``ShedReason`` values are the ``reason`` label of ``ballast_shed_total`` and the
``X-Ballast-Reason`` header: a closed set, so the metric's cardinality is bounded.
"""

from __future__ import annotations

import enum


class Outcome(enum.Enum):
    """What a released permit tells the limit algorithm."""

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
