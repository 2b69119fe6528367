"""The simulation tables: false rollbacks over the grid, and detection speed per regression.

Every cell runs ``trials`` seeded independent canaries (1 s blocks): an
identical canary for 10 simulated minutes, a regressed one for 30. The seed
of a cell is derived from the run's seed and the cell, so any cell can be
re-run alone.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

import numpy as np

from ballast_asgi.canary.core.evidence import DEFAULT_PARAMS
from experiments.canary import rules, warm
from experiments.canary.model import NONE, REGRESSIONS, Cell, Regression, simulate

RPS = (200, 2000)
SHARES = (0.01, 0.05, 0.25)
BASE_ERRORS = (0.001, 0.005, 0.01, 0.02)
MODELS = ("independent", "bursty")
RULES = ("sequential", "fixed_horizon", "threshold")
#: How long an identical canary runs (false rollbacks) and how long a bad one may take.
H0_HORIZON_S = 600
H1_HORIZON_S = 1800
ALPHA = 0.01
#: The base error of the detection table (the +5 pp row runs at every base error).
DETECTION_BASE = 0.01


@dataclass(frozen=True)
class Result:
    """One cell, one regression, one rule: rollback times of every trial."""

    cell: Cell
    regression: str
    rule: str
    times: tuple[float, ...]
    #: Share of trials whose stable history read calm on errors (sequential rule only).
    calm: float | None = None

    @property
    def rate(self) -> float:
        """Share of trials rolled back within the horizon."""
        return sum(math.isfinite(t) for t in self.times) / len(self.times)

    @property
    def rolled_back(self) -> int:
        """Trials rolled back within the horizon."""
        return sum(math.isfinite(t) for t in self.times)

    @property
    def median_s(self) -> float:
        """Median seconds to rollback over all trials (inf when fewer than half were caught)."""
        return float(np.median(np.asarray(self.times)))

    def as_dict(self) -> dict[str, object]:
        """JSON-safe summary (no per-trial times)."""
        return {**asdict(self.cell), "regression": self.regression, "rule": self.rule,
                "trials": len(self.times), "rolled_back": self.rolled_back,
                "rate": self.rate, "median_s": _json_float(self.median_s),
                "calm_errors": self.calm}  # fmt: skip


def _json_float(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _seed(seed: int, *parts: object) -> int:
    return zlib.crc32(repr((seed, *parts)).encode())


#: Trials simulated at once; a larger cell runs in chunks of this many (bounded memory).
CHUNK = 500


def run_cell(cell: Cell, reg: Regression, trials: int, seed: int) -> list[Result]:
    """Simulate one cell once and apply every rule to the same blocks.

    The sequential rule also gets each trial's warm start (``warm.py``: 10
    minutes of stable history, drawn from its own seed, so the blocks are the
    same as without it).

    Up to ``CHUNK`` trials are drawn at once from the cell's seed; more are
    drawn in chunks, each from its own seed (the cell's, plus the chunk's index).
    """
    horizon = H0_HORIZON_S if reg.name == "none" else H1_HORIZON_S
    times: dict[str, list[float]] = {rule: [] for rule in RULES}
    calm_errors: list[bool] = []
    for i, start in enumerate(range(0, trials, CHUNK if trials > CHUNK else trials)):
        parts = (cell, reg.name) if trials <= CHUNK else (cell, reg.name, "chunk", i)
        rng = np.random.default_rng(_seed(seed, *parts))
        blocks = simulate(cell, reg, min(CHUNK, trials - start), horizon, rng)
        history_rng = np.random.default_rng(_seed(seed, *parts, "history"))
        calm = warm.regimes(cell, min(CHUNK, trials - start), history_rng)
        calm_errors.extend(bool(x) for x in calm[0])
        for rule in RULES:
            times[rule].extend(float(t) for t in rules.apply(rule, blocks, ALPHA, calm))
    calm_share = sum(calm_errors) / len(calm_errors)
    return [Result(cell, reg.name, rule, tuple(times[rule]),
                   calm_share if rule == "sequential" else None)
            for rule in RULES]  # fmt: skip


def fr_trials(results: list[Result]) -> int:
    """Trials per false-rollback cell in these results (0 when there are none)."""
    return max((len(r.times) for r in results if r.regression == "none"), default=0)


def h0_cells() -> Iterator[Cell]:
    """The false-rollback grid: 4 base errors x 3 shares x 2 rates x outage x 2 models."""
    for model in MODELS:
        for outage in (False, True):
            for rps in RPS:
                for share in SHARES:
                    for base in BASE_ERRORS:
                        yield Cell(rps, share, base, outage, model)


def h1_cells() -> Iterator[tuple[Cell, Regression]]:
    """The detection grid, independent errors: +5 pp at every base error, the rest at 1 %."""
    for reg in REGRESSIONS:
        for rps in RPS:
            for share in SHARES:
                for base in BASE_ERRORS if reg is REGRESSIONS[0] else (DETECTION_BASE,):
                    yield Cell(rps, share, base), reg


#: The caps the sweep compares (the default is one of them).
SWEEP_CAPS = (0.3, 0.5, 1.0, 1.5)


@dataclass(frozen=True)
class SweepRow:
    """One cap: the worst bursty false-rollback cell at 2,000 rps and the +5 pp detection there."""

    cap: float
    worst_false: float
    worst_false_cell: Cell
    pp5_median_s: dict[float, float]


def cap_sweep(trials: int, seed: int, caps: tuple[float, ...] = SWEEP_CAPS) -> list[SweepRow]:
    """What the per-block cap trades at 2,000 rps: bursty false rollbacks against +5 pp speed.

    The same simulated blocks are judged at every cap (bursty identical canaries
    at every share and base error, no outage; +5 pp at every share, 2 % base).
    """
    h0 = [Cell(2000, s, b, model="bursty") for s in SHARES for b in BASE_ERRORS]
    h0_blocks = [simulate(c, NONE, trials, H0_HORIZON_S,
                          np.random.default_rng(_seed(seed, "sweep", c))) for c in h0]  # fmt: skip
    h1 = [Cell(2000, s, 0.02) for s in SHARES]
    h1_blocks = [simulate(c, REGRESSIONS[0], trials, 300,
                          np.random.default_rng(_seed(seed, "sweep", c))) for c in h1]  # fmt: skip
    rows = []
    for cap in caps:
        params = replace(DEFAULT_PARAMS, cap_nats=cap)
        rates = [float(np.isfinite(rules.sequential(b, ALPHA, params=params)).mean())
                 for b in h0_blocks]  # fmt: skip
        worst = max(range(len(h0)), key=rates.__getitem__)
        meds = {c.share: float(np.median(rules.sequential(b, ALPHA, params=params)))
                for c, b in zip(h1, h1_blocks, strict=True)}  # fmt: skip
        rows.append(SweepRow(cap, rates[worst], h0[worst], meds))
    return rows
