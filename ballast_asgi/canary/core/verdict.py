"""What every canary rule shares: the ``Verdict`` it returns, the ``Totals`` it
keeps, and the ``Judge`` protocol the rollout drives (``judges.py`` has the
rules and ``make_judge``; ``baselines.py`` the two baseline rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ballast_asgi.canary.core.blocks import Block


@dataclass(frozen=True, slots=True)
class Verdict:
    """A decision to roll back: which metric and the numbers behind it."""

    reason: str
    evidence: dict[str, Any]


@dataclass(slots=True)
class Totals:
    """Cumulative counts per version since the canary started."""

    requests_c: int = 0
    requests_s: int = 0
    errors_c: int = 0
    errors_s: int = 0
    slow_c: int = 0
    slow_s: int = 0

    def add(self, b: Block) -> None:
        """Add one block's counts."""
        self.requests_c += b.requests_c
        self.requests_s += b.requests_s
        self.errors_c += b.errors_c
        self.errors_s += b.errors_s
        self.slow_c += b.slow_c
        self.slow_s += b.slow_s

    def as_dict(self) -> dict[str, dict[str, int]]:
        """Counts per version, as the admin endpoint shows them."""
        return {
            "canary": {"requests": self.requests_c, "errors": self.errors_c, "slow": self.slow_c},
            "stable": {"requests": self.requests_s, "errors": self.errors_s, "slow": self.slow_s},
        }


class Judge(Protocol):
    """What the rollout needs from a rule."""

    name: str
    totals: Totals

    def update(self, block: Block) -> Verdict | None:
        """Take one finished block; a verdict when the canary must go."""
        ...

    def statistic(self) -> dict[str, Any]:
        """The current statistic (JSON-safe), for the admin endpoint and the evidence."""
        ...

    def may_promote(self) -> bool:
        """Whether a ramp may promote now (the rule has nothing left to test)."""
        ...
