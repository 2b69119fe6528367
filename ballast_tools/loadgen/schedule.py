"""Arrival schedules for the open-loop generator (pure, seeded).

A schedule is the list of *intended* send times (offsets in seconds from the
start of the run) and the tier of each request, fixed before the run starts
so that nothing the target does can change what is offered.

- Constant arrivals: ``offset_i = i / rate_rps`` for ``i = 0 .. floor(rate * duration) - 1``.
- Poisson arrivals: inter-arrival gaps drawn from ``Exp(rate_rps)``
  (``rng.expovariate``), so the count in ``duration_s`` is Poisson with mean
  ``rate * duration`` and gaps have mean ``1 / rate``.
- Tiers are drawn independently per request with probabilities proportional to
  the tier weights (reference mix 5/35/60 critical/standard/bulk, deadlines
  400 ms / 1 s / 3 s).

The same seed gives the same schedule.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

TIER_NAMES = ("critical", "standard", "bulk")
DEFAULT_MIX = (5.0, 35.0, 60.0)
DEFAULT_DEADLINES_S = (0.4, 1.0, 3.0)


@dataclass(frozen=True)
class Tier:
    """One traffic class: its name, share and deadline (and path, priority header).

    ``path`` (e.g. ``/slow``) is appended to the target's path; ``priority`` is
    the ``X-Priority`` sent (the name when empty). A path mix is one tier per
    (priority, path), e.g. ``critical:/slow`` (``make_path_tiers``).
    """

    name: str
    weight: float
    deadline_s: float
    path: str = ""
    priority: str = ""

    @property
    def priority_header(self) -> str:
        """The ``X-Priority`` value."""
        return self.priority or self.name


def make_tiers(
    mix: Sequence[float] = DEFAULT_MIX, deadlines_s: Sequence[float] = DEFAULT_DEADLINES_S
) -> tuple[Tier, ...]:
    """Critical/standard/bulk tiers from weights and deadlines (three of each)."""
    if len(mix) != len(TIER_NAMES) or len(deadlines_s) != len(TIER_NAMES):
        raise ValueError("mix and deadlines need one value per tier: critical,standard,bulk")
    if any(w < 0 for w in mix) or sum(mix) <= 0:
        raise ValueError("mix weights must be >= 0 and not all 0")
    if any(d <= 0 for d in deadlines_s):
        raise ValueError("deadlines must be > 0")
    return tuple(
        Tier(n, float(w), float(d)) for n, w, d in zip(TIER_NAMES, mix, deadlines_s, strict=True)
    )


DEFAULT_TIERS = make_tiers()


def make_path_tiers(
    paths: Sequence[tuple[str, float, float]], mix: Sequence[float] = DEFAULT_MIX
) -> tuple[Tier, ...]:
    """One tier per (priority, path): ``paths`` is (path, share, deadline s) per endpoint.

    A request's path is drawn by ``share``, its priority by ``mix``; every
    priority of a path has the path's deadline. Names: ``critical:/slow``.
    """
    if not paths:
        raise ValueError("paths needs at least one (path, share, deadline)")
    for path, share, deadline_s in paths:
        if not path.startswith("/") or share < 0 or deadline_s <= 0:
            raise ValueError(f"bad path class {path!r}: path starts with '/', share >= 0, "
                             "deadline > 0")  # fmt: skip
    base = make_tiers(mix)
    total = sum(share for _, share, _ in paths) * sum(t.weight for t in base)
    if total <= 0:
        raise ValueError("path shares must not all be 0")
    return tuple(
        Tier(f"{t.name}:{path}", share * t.weight / total, deadline_s, path, t.name)
        for path, share, deadline_s in paths
        for t in base
    )


@dataclass(frozen=True)
class Schedule:
    """Intended send offsets (seconds, ascending) and the tier index of each."""

    offsets_s: list[float]
    tier_ids: list[int]
    tiers: tuple[Tier, ...]
    duration_s: float

    def __len__(self) -> int:
        return len(self.offsets_s)

    def count_by_tier(self) -> dict[str, int]:
        """How many arrivals each tier has."""
        counts = dict.fromkeys((t.name for t in self.tiers), 0)
        for i in self.tier_ids:
            counts[self.tiers[i].name] += 1
        return counts


def constant_offsets(rate_rps: float, duration_s: float) -> list[float]:
    """Evenly spaced send times."""
    n = int(rate_rps * duration_s + 1e-9)
    return [i / rate_rps for i in range(n)]


def poisson_offsets(rate_rps: float, duration_s: float, rng: random.Random) -> list[float]:
    """Send times of a Poisson process with intensity ``rate_rps``."""
    out: list[float] = []
    t = rng.expovariate(rate_rps)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate_rps)
    return out


def build_schedule(
    rate_rps: float,
    duration_s: float,
    rng: random.Random,
    *,
    poisson: bool = False,
    tiers: tuple[Tier, ...] = DEFAULT_TIERS,
) -> Schedule:
    """The full schedule for one run."""
    if rate_rps <= 0 or duration_s <= 0:
        raise ValueError("rate_rps and duration_s must be > 0")
    if poisson:
        offsets = poisson_offsets(rate_rps, duration_s, rng)
    else:
        offsets = constant_offsets(rate_rps, duration_s)
    weights = [t.weight for t in tiers]
    tier_ids = rng.choices(range(len(tiers)), weights=weights, k=len(offsets))
    return Schedule(offsets, tier_ids, tiers, duration_s)
