"""The canary split on the proxy's selector seam.

``CanarySelector`` wraps the stable selector (one upstream or a pool) and the
canary's. For each attempt, ``choose`` asks the split which version the
request belongs to *at the current weight* (so a request still queued when
the canary is rolled back goes to stable), remembers the version in the
request's ``Assignment`` (set by ``CanaryMiddleware`` in a context variable:
the proxy runs in the request's task) and delegates to that version's
selector. ``report`` hands the attempt's outcome to the chosen selector and
counts it for the judge: 5xx, timeouts, connect and protocol errors are
errors; a success's time to the response head is its latency; deadline
misses, clients gone and the gateway's own refusals count for neither.
With a ``ClientBudget`` one client's outcomes count at most ``per_window``
times per judge block (``clients.py``); the rest are served but not judged.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ballast_asgi.canary.core.blocks import Version
from ballast_asgi.canary.core.clients import ClientBudget
from ballast_asgi.canary.core.history import StableHistory
from ballast_asgi.canary.core.rollout import Rollout, State
from ballast_asgi.canary.core.split import Split
from ballast_asgi.canary.log import announce
from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Clock, RawHeaders
from ballast_asgi.proxy.upstream import Selector, Upstream

_FAILED = frozenset(
    {
        AttemptOutcome.STATUS_5XX,
        AttemptOutcome.TIMEOUT,
        AttemptOutcome.CONNECT_ERROR,
        AttemptOutcome.PROTOCOL_ERROR,
    }
)


#: Called for every attempt the judge counted: (version, failed, latency_s).
RecordHook = Callable[[Version, bool, "float | None"], None]


@dataclass(slots=True)
class Assignment:
    """One request's sticky key, its client and the version its latest attempt went to."""

    key: bytes | None
    version: Version | None = None
    #: The resolved client address (the per-client evidence budget's key).
    client: str | None = None
    #: A signed cookie value to set on the response (a request without a valid one).
    issue: bytes | None = None


ASSIGNMENT: contextvars.ContextVar[Assignment | None] = contextvars.ContextVar(
    "ballast_canary_assignment", default=None
)


class CanarySelector:
    """Stable or canary per request, at the rollout's weight; outcomes feed the judge."""

    def __init__(
        self,
        stable: Selector,
        canary: Selector,
        rollout: Rollout,
        split: Split,
        *,
        clock: Clock = time.monotonic,
        on_record: RecordHook | None = None,
        history: StableHistory | None = None,
        budget: ClientBudget | None = None,
    ) -> None:
        self.stable = stable
        self.canary = canary
        self.rollout = rollout
        self.split = split
        self.clock = clock
        self._on_record = on_record
        self.history = history
        self.budget = budget

    def assign(self, headers: RawHeaders, client: str | None = None) -> Assignment:
        """A request's assignment (its key and client; the version is decided per attempt).

        With a signed cookie configured, a request without a valid one gets a
        fresh id as its key, and the cookie to keep it (``issue``).
        """
        key = self.split.key(headers)
        if key is None and self.split.signs:
            ident = self.split.new_ident()
            return Assignment(b"s:" + ident, client=client, issue=self.split.sign(ident))
        return Assignment(key, client=client)

    def version_for(self, assignment: Assignment | None) -> Version:
        """The version this attempt goes to at the current weight."""
        weight = self.rollout.weight
        if assignment is None:
            return self.split.choose([], weight)
        if weight >= 1.0:
            return Version.CANARY
        if weight <= 0.0:
            return Version.STABLE
        if assignment.version is None or assignment.key is not None:
            point = self.split.point(assignment.key)
            return Version.CANARY if point < weight else Version.STABLE
        return assignment.version  # a keyless retry stays where it was

    def choose(self, ctx: Any, exclude: Collection[Upstream] = ()) -> Upstream:
        """The chosen version's upstream for this attempt."""
        assignment = ASSIGNMENT.get()
        version = self.version_for(assignment)
        if assignment is not None:
            assignment.version = version
        inner = self.canary if version is Version.CANARY else self.stable
        return inner.choose(ctx, exclude)

    def report(
        self, upstream: Upstream, outcome: AttemptOutcome, rtt_s: float | None, now: float
    ) -> None:
        """Pass the outcome to the version's selector and count it for the judge."""
        assignment = ASSIGNMENT.get()
        version = assignment.version if assignment is not None else None
        if version is None:
            version = Version.CANARY if upstream in self.canary.upstreams() else Version.STABLE
        (self.canary if version is Version.CANARY else self.stable).report(
            upstream, outcome, rtt_s, now
        )
        failed = outcome in _FAILED
        if not failed and outcome is not AttemptOutcome.SUCCESS:
            return
        latency = None if failed else rtt_s
        if version is Version.STABLE:
            self._remember(upstream, failed, latency, now)
        if self.rollout.state is not State.RUNNING:
            return
        if self.budget is not None:
            self.rollout.tick(now)  # the block this outcome falls in
            client = assignment.client if assignment is not None else None
            if not self.budget.admit(client, self.rollout.recorder.start):
                return
        self.rollout.record(version, failed, latency, now)
        if self.rollout.state is not State.RUNNING:
            announce(self.rollout)  # the run just ended (docs/operations.md)
        if self._on_record is not None:
            self._on_record(version, failed, latency)

    def _remember(
        self, upstream: Upstream, failed: bool, latency: float | None, now: float
    ) -> None:
        """One stable attempt into the per-instance history (before, during and after a canary)."""
        if self.history is None:
            return
        line = self.rollout.recorder.baseline.threshold_s
        slow = None if failed or latency is None or line is None else latency > line
        self.history.record(upstream.display, failed, slow, now)

    def report_body(self, upstream: Upstream, complete: bool, now: float) -> None:
        """Pass a body's end to the version's selector (the judge counted the head)."""
        inner = self.canary if upstream in self.canary.upstreams() else self.stable
        inner.report_body(upstream, complete, now)

    def label(self, version: Version) -> str:
        """The ``X-Ballast-Version`` value: after promotion the canary *is* stable."""
        if self.rollout.state is State.PROMOTED:
            return Version.STABLE.value
        return version.value

    def upstreams(self) -> Sequence[Upstream]:
        """Stable's upstreams first, then the canary's."""
        return (*self.stable.upstreams(), *self.canary.upstreams())


__all__ = ["ASSIGNMENT", "Assignment", "CanarySelector"]
