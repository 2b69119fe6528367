"""The canary's life: running through ramp steps, then promoted or rolled back.

States::

    running --(judge verdict | operator)--> rolled_back   (weight 0 at once)
    running --(last step passed | operator)--> promoted    (the canary is the new stable)

(``none`` is what the gateway reports when no canary is configured.)

Weight: with ramp ``steps`` (e.g. 0.01, 0.05, 0.25, 0.5) the weight is the
current step's; a step passes once it has run ``step_s`` seconds *and* the
canary served ``min_requests`` requests in it, so low traffic waits instead
of promoting on no evidence; after the last step the canary is promoted.
Without steps the weight stays at the configured value until an operator
promotes or the judge rolls back. The judge sees every block of the whole run
(its guarantee holds across steps; it is never reset). The last step promotes
only when the judge ``may_promote`` (the fixed-horizon rule: once its test at
the horizon ran), so a ramp shorter than the horizon holds its last step.

Time is an argument (``now``, monotonic seconds); nothing here does I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ballast_asgi.canary.core.blocks import BlockRecorder, LatencyBaseline, Version
from ballast_asgi.canary.core.judges import Judge, Verdict


class State(enum.StrEnum):
    """Where the canary is (``GET /_ballast/canary`` ``state``)."""

    NONE = "none"
    RUNNING = "running"
    ROLLED_BACK = "rolled_back"
    PROMOTED = "promoted"


@dataclass(frozen=True, slots=True)
class RampPlan:
    """Ramp steps (weights, increasing) and when a step has passed."""

    steps: tuple[float, ...] = ()
    step_s: float = 60.0
    min_requests: int = 100

    def __post_init__(self) -> None:
        if any(not 0.0 < w <= 1.0 for w in self.steps):
            raise ValueError("ramp steps must be weights in (0, 1]")
        if list(self.steps) != sorted(self.steps):
            raise ValueError("ramp steps must not decrease")


@dataclass(frozen=True, slots=True)
class Decision:
    """How the canary ended: promoted or rolled back, why, when, on what evidence."""

    state: State
    reason: str
    at: float
    evidence: dict[str, Any]


class Rollout:
    """One canary run: the split weight, the judge fed with blocks, the ramp."""

    def __init__(
        self,
        judge: Judge,
        *,
        now: float,
        weight: float = 0.1,
        plan: RampPlan = RampPlan(),
        block_s: float = 1.0,
        baseline: LatencyBaseline | None = None,
    ) -> None:
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"weight must be in [0, 1], got {weight}")
        self.judge = judge
        self.plan = plan
        self.block_s = block_s
        self.recorder = BlockRecorder(baseline or LatencyBaseline(), now)
        self.started = now
        self.decision: Decision | None = None
        self._fixed_weight = weight
        self._step = 0
        self._step_started = now
        self._step_requests = 0

    @property
    def state(self) -> State:
        """``running`` until a decision, then ``rolled_back`` or ``promoted``."""
        return State.RUNNING if self.decision is None else self.decision.state

    @property
    def step(self) -> int | None:
        """Index of the current ramp step (None without steps)."""
        return self._step if self.plan.steps else None

    @property
    def weight(self) -> float:
        """The canary's share of new requests right now (0 after a rollback, 1 after promotion)."""
        if self.decision is not None:
            return 1.0 if self.decision.state is State.PROMOTED else 0.0
        return self.plan.steps[self._step] if self.plan.steps else self._fixed_weight

    def record(self, version: Version, failed: bool, latency_s: float | None, now: float) -> None:
        """One finished attempt (ignored once the canary is decided)."""
        self.tick(now)
        if self.decision is not None:
            return
        self.recorder.record(version, failed, latency_s)
        self._step_requests += version is Version.CANARY

    def tick(self, now: float) -> None:
        """Close the block when it is due, let the judge see it, advance the ramp."""
        if self.decision is not None or now - self.recorder.start < self.block_s:
            return
        verdict = self.judge.update(self.recorder.close(now))
        if verdict is not None:
            self._decide(State.ROLLED_BACK, verdict, now)
            return
        self._advance(now)

    def _advance(self, now: float) -> None:
        steps = self.plan.steps
        if not steps or now - self._step_started < self.plan.step_s:
            return
        if self._step_requests < self.plan.min_requests:
            return  # low traffic: wait for evidence, never promote on none
        if self._step + 1 >= len(steps):
            if not self.judge.may_promote():
                return  # e.g. the fixed horizon has not tested yet: hold the last step
            self._decide(State.PROMOTED, Verdict("ramp_complete", self.judge.statistic()), now)
            return
        self._step += 1
        self._step_started = now
        self._step_requests = 0

    def rollback(self, now: float, reason: str = "operator") -> Decision:
        """Roll back at once (idempotent: a decided canary keeps its first decision)."""
        if self.decision is None:
            self._decide(State.ROLLED_BACK, Verdict(reason, self.judge.statistic()), now)
        assert self.decision is not None
        return self.decision

    def promote(self, now: float, reason: str = "operator") -> Decision:
        """Promote at once (idempotent, like ``rollback``)."""
        if self.decision is None:
            self._decide(State.PROMOTED, Verdict(reason, self.judge.statistic()), now)
        assert self.decision is not None
        return self.decision

    def _decide(self, state: State, verdict: Verdict, now: float) -> None:
        self.decision = Decision(state, verdict.reason, now, verdict.evidence)

    def snapshot(self, now: float) -> dict[str, Any]:
        """The JSON document behind ``GET /_ballast/canary``."""
        doc: dict[str, Any] = {
            "state": self.state.value,
            "weight": self.weight,
            "rule": self.judge.name,
            "running_s": round(now - self.started, 3),
            "step": self.step,
            "steps": list(self.plan.steps),
            "counts": self.judge.totals.as_dict(),
            "statistic": self.judge.statistic(),
            "latency_threshold_s": self.recorder.baseline.threshold_s,
            "decision": None,
        }
        if self.decision is not None:
            d = self.decision
            at_s = round(d.at - self.started, 3)
            doc["decision"] = {
                "state": d.state.value, "reason": d.reason, "at_s": at_s, "evidence": d.evidence
            }  # fmt: skip
        return doc


__all__ = ["Decision", "RampPlan", "Rollout", "State"]
