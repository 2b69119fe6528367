"""The four anchor scenarios as run specifications, and their arrival schedules (pure).

Every run offers a piecewise-linear rate per tier (``Phase``: each tier's
rate at the phase's start and end; equal for a step, different for a ramp)
with constant (deterministic) arrivals, so a run's schedule depends only on
its phases. Times of backend changes (``events``) are seconds from the start
of the load. ``Lengths`` holds every duration; ``QUICK`` is the CI-size
smoke, ``FULL`` the real lengths.

Capacity: 1x = 250 rps on the reference backend (8 workers, 25 / 120 ms,
5 % slow: model 269 rps, measured about 264 rps), as in ``experiments.sweep``.
Scenario 4 uses Envoy issue #7789's backend instead: 8 workers, 50 / 150 ms
with 5 % slow, so p90 50 ms and p99 150 ms (model capacity 145 rps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ballast_tools.loadgen.schedule import TIER_NAMES, Schedule, make_tiers
from experiments.sweep.plan import CAPACITY_1X_RPS, DEADLINES_S, FAST_MS, MIX, SLOW_MS

#: Envoy #7789's fake server: 8 workers, p90 50 ms, p99 150 ms (5 % at 150 ms).
ENVOY_FAST_MS, ENVOY_SLOW_MS, ENVOY_WORKERS = 50.0, 150.0, 8
ENVOY_CAPACITY_RPS = ENVOY_WORKERS / (0.95 * ENVOY_FAST_MS + 0.05 * ENVOY_SLOW_MS) * 1e3
#: Envoy's client timed out at 1 s: every tier gets that deadline in scenario 4.
ENVOY_DEADLINE_S = 1.0
#: Scenario 2's steady load (rps per tier) and the bulk spike factor (Netflix: 12x prefetch).
PRIORITY_RPS = {"critical": 40.0, "standard": 60.0, "bulk": 100.0}
BULK_SPIKE_X = 12.0
SPIKE_LOADS = (1.4, 4.0)
STEADY_X = 1.2
DETECT_TOP_X = 1.5
SLOWDOWN_X = 5.0
GATEWAY_LIMITERS = ("gradient", "fixed-16", "fixed-64", "fixed-256")
PEER_LIMITERS = ("haproxy-16", "haproxy-64", "haproxy-256")


@dataclass(frozen=True)
class Lengths:
    """Every duration of the four scenarios (seconds)."""

    spike_before_s: float = 10.0
    spike_s: float = 20.0
    priority_before_s: float = 10.0
    priority_spike_s: float = 30.0
    priority_after_s: float = 10.0
    steady_s: float = 600.0
    steady_warmup_s: float = 60.0
    steady_window_s: float = 10.0
    detect_ramp_s: float = 160.0
    detect_hold_s: float = 10.0
    detect_slow_s: float = 30.0


FULL = Lengths()
QUICK = Lengths(spike_before_s=3.0, spike_s=5.0, priority_before_s=2.0, priority_spike_s=5.0,
                priority_after_s=2.0, steady_s=24.0, steady_warmup_s=6.0, steady_window_s=2.0,
                detect_ramp_s=12.0, detect_hold_s=3.0, detect_slow_s=6.0)  # fmt: skip


@dataclass(frozen=True)
class Phase:
    """``duration_s`` of load: each tier's rate goes linearly from ``start`` to ``end`` (rps)."""

    duration_s: float
    start: tuple[float, float, float]
    end: tuple[float, float, float] | None = None

    @property
    def end_rates(self) -> tuple[float, float, float]:
        """The rates at the phase's end (the start's for a step)."""
        return self.end if self.end is not None else self.start


@dataclass(frozen=True)
class Backend:
    """The simulator's profile at the start of a run."""

    workers: int = 8
    fast_ms: float = FAST_MS
    slow_ms: float = SLOW_MS
    capacity_rps: float = CAPACITY_1X_RPS


REFERENCE = Backend()
ENVOY = Backend(ENVOY_WORKERS, ENVOY_FAST_MS, ENVOY_SLOW_MS, ENVOY_CAPACITY_RPS)


@dataclass(frozen=True)
class AnchorRun:
    """One run: a fresh simulator and target (gateway or peer), one open-loop load."""

    scenario: str
    limiter: str
    phases: tuple[Phase, ...]
    deadlines_s: tuple[float, float, float] = DEADLINES_S
    backend: Backend = REFERENCE
    #: (seconds from the load's start, simulator /profile update)
    events: tuple[tuple[float, dict[str, Any]], ...] = ()
    #: The time the scenario's disturbance starts (the step, the spike, the slowdown).
    change_s: float = 0.0
    load_x: float = 1.0
    lengths: Lengths = field(default=FULL)
    seed: int = 1

    @property
    def duration_s(self) -> float:
        """The whole load's length."""
        return sum(p.duration_s for p in self.phases)

    @property
    def name(self) -> str:
        """File-name-safe, e.g. ``spike-gradient-4x``."""
        return f"{self.scenario}-{self.limiter}-{self.load_x:g}x"

    @property
    def peak_rps(self) -> float:
        """The highest total offered rate."""
        return max(max(sum(p.start), sum(p.end_rates)) for p in self.phases)


def _mix_rates(total_rps: float) -> tuple[float, float, float]:
    """``total_rps`` split 5 / 35 / 60 % critical / standard / bulk."""
    whole = sum(MIX)
    r = [total_rps * w / whole for w in MIX]
    return r[0], r[1], r[2]


def spike(lengths: Lengths, loads: tuple[float, ...], limiters: tuple[str, ...]) -> list[AnchorRun]:
    """Scenario 1: 0.5x, then a step to each of ``loads`` x capacity."""
    cap = CAPACITY_1X_RPS
    out = []
    for x in loads:
        phases = (Phase(lengths.spike_before_s, _mix_rates(0.5 * cap)),
                  Phase(lengths.spike_s, _mix_rates(x * cap)))  # fmt: skip
        out += [AnchorRun("spike", lim, phases, change_s=lengths.spike_before_s, load_x=x,
                          lengths=lengths) for lim in limiters]  # fmt: skip
    return out


def priority(lengths: Lengths, limiters: tuple[str, ...]) -> list[AnchorRun]:
    """Scenario 2: steady critical / standard / bulk, bulk x12 for the middle phase."""
    c, s, b = (PRIORITY_RPS[t] for t in TIER_NAMES)
    base, spiked = (c, s, b), (c, s, b * BULK_SPIKE_X)
    phases = (Phase(lengths.priority_before_s, base), Phase(lengths.priority_spike_s, spiked),
              Phase(lengths.priority_after_s, base))  # fmt: skip
    x = sum(spiked) / CAPACITY_1X_RPS
    return [AnchorRun("priority", lim, phases, change_s=lengths.priority_before_s, load_x=x,
                      lengths=lengths) for lim in limiters]  # fmt: skip


def steady(lengths: Lengths, limiters: tuple[str, ...] = ("gradient",)) -> list[AnchorRun]:
    """Scenario 3: a long run at 1.2x."""
    phases = (Phase(lengths.steady_s, _mix_rates(STEADY_X * CAPACITY_1X_RPS)),)
    return [AnchorRun("steady", lim, phases, load_x=STEADY_X, lengths=lengths) for lim in limiters]


def detect(lengths: Lengths, limiters: tuple[str, ...] = ("gradient",)) -> list[AnchorRun]:
    """Scenario 4: Envoy #7789's backend, a ramp to 1.5x, a hold, then 5x slower."""
    top = _mix_rates(DETECT_TOP_X * ENVOY_CAPACITY_RPS)
    slow_at = lengths.detect_ramp_s + lengths.detect_hold_s
    phases = (Phase(lengths.detect_ramp_s, (0.0, 0.0, 0.0), top),
              Phase(lengths.detect_hold_s + lengths.detect_slow_s, top))  # fmt: skip
    deadlines = (ENVOY_DEADLINE_S,) * 3
    events = ((slow_at, {"latency_multiplier": SLOWDOWN_X}),)
    return [AnchorRun("detect", lim, phases, deadlines, ENVOY, events, slow_at, DETECT_TOP_X,
                      lengths) for lim in limiters]  # fmt: skip


SCENARIOS = ("spike", "priority", "steady", "detect")


def full_plan(lengths: Lengths = FULL, *, peers: bool = True) -> list[AnchorRun]:
    """Every scenario; the peers (HAProxy) in the spike and priority tables when ``peers``."""
    limiters = GATEWAY_LIMITERS + (PEER_LIMITERS if peers else ())
    return [*spike(lengths, SPIKE_LOADS, limiters), *priority(lengths, limiters),
            *steady(lengths), *detect(lengths)]  # fmt: skip


def arrivals(phase_start_s: float, phase: Phase, tier: int) -> list[float]:
    """Constant arrivals of one tier in one phase, rate linear from start to end.

    The i-th arrival is where the cumulative count ``N(t) = r0 t + (r1 - r0) t^2 / 2T``
    reaches ``i`` (i = 0, 1, ...), so a step gives ``i / r`` and a ramp from 0
    starts with an arrival at once and then denser and denser ones.
    """
    r0, r1, dur = phase.start[tier], phase.end_rates[tier], phase.duration_s
    total = (r0 + r1) / 2 * dur
    n = int(total + 1e-9)
    a = (r1 - r0) / (2 * dur) if dur > 0 else 0.0
    out = []
    for i in range(n):
        step = abs(a) < 1e-12
        out.append(
            phase_start_s + (i / r0 if step else (math.sqrt(r0 * r0 + 4 * a * i) - r0) / (2 * a))
        )
    return out


def schedule(run: AnchorRun) -> Schedule:
    """The run's whole schedule: every tier's arrivals merged by time."""
    tiers = make_tiers((1.0, 1.0, 1.0), run.deadlines_s)
    pairs: list[tuple[float, int]] = []
    start = 0.0
    for phase in run.phases:
        for tier in range(len(TIER_NAMES)):
            pairs += [(t, tier) for t in arrivals(start, phase, tier)]
        start += phase.duration_s
    pairs.sort()
    return Schedule([t for t, _ in pairs], [i for _, i in pairs], tiers, run.duration_s)
