"""What ``make experiment`` runs: the run specifications and the time dilation.

**Capacity (1x).** The simulator's model capacity is
``8 / (0.95 * 25 ms + 0.05 * 120 ms) = 269 rps``; measured, it serves about
264 rps (an ``asyncio.sleep(0.025)`` lasts a little longer than 25 ms, see
``docs/instruments.md``). The reference treats about 250 rps as capacity; we
use **1x = 250 rps** so each cell offers the same rate as the reference's
(12x = 3,000 rps) and 1x is just below saturation (93 % of the model), not
already past it.

**Time dilation k.** A two-core machine hosts the generator, the gateway and
the simulator at once. With dilation ``k`` every *time of the simulated
system* is multiplied by ``k`` and every *rate* divided by ``k``: service
times ``25k`` / ``120k`` ms (so capacity is ``250 / k`` rps), offered rates
``/ k``, tier deadlines ``400k`` ms / ``1k`` s / ``3k`` s. Load multiples
(1x..12x), the backend changes (x5 latency, 8 -> 64 workers) and the mix are
unchanged, so the shape of each experiment is the same while our processes
do ``k`` times less work per second. **Run durations and the times of the
backend changes are not dilated** (the total run time must stay under 15
minutes), so a dilated run covers ``k`` times fewer service times; the
gateway's own parameters (controller window 500 ms, probe interval) are the
product's defaults and are not dilated either, which if anything makes the
controller relatively faster. Latencies in the tables are divided by ``k``
so they read in the reference's undilated milliseconds; counts are reported
as measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

CAPACITY_1X_RPS = 250.0
MODEL_CAPACITY_RPS = 8 / (0.95 * 0.025 + 0.05 * 0.120)
FAST_MS, SLOW_MS = 25.0, 120.0
DEADLINES_S = (0.4, 1.0, 3.0)
MIX = (5.0, 35.0, 60.0)
#: 24x (6,000 rps, issue 31): the overload headroom; the reference stops at 12x.
SWEEP_LOADS = (1, 2, 4, 8, 12, 24)
FIXED = ("fixed-16", "fixed-64", "fixed-256")
#: What users would run instead (issue 32; ``experiments/_harness/peers.py``): HAProxy with
#: a priority-class queue at three maxconn, nginx with max_conns and limit_conn/limit_req.
PEERS = ("haproxy-16", "haproxy-64", "haproxy-256", "nginx-32")
SWEEP_LIMITERS = (*FIXED, "gradient", *PEERS)
#: The default and the fixed limits, plus the other adaptive algorithms as competitors.
CHANGE_LIMITERS = (*FIXED, "gradient", "gradient2", "vegas", *PEERS)
#: Names ``--limiters`` expands: ``--limiters gradient,fixed,peers``.
LIMITER_GROUPS = {"fixed": FIXED, "peers": PEERS, "haproxy": PEERS[:3]}
SWING_RPS = 1600.0
SEED = 1


@dataclass(frozen=True)
class RunSpec:
    """One run: a fresh simulator and gateway, one open-loop load."""

    scenario: str
    limiter: str
    load_x: float
    rate_rps: float
    duration_s: float
    k: float = 1.0
    workers: int = 8
    #: (seconds from the load's start, simulator /profile update)
    events: tuple[tuple[float, dict[str, Any]], ...] = ()
    early_drop: bool = False
    seed: int = SEED
    tags: tuple[str, ...] = field(default=())
    #: Repetition number (0-based): every cell is the median of its repetitions.
    rep: int = 0

    @property
    def name(self) -> str:
        """Unique, file-name-safe name, e.g. ``sweep-gradient-12x``."""
        extra = "-early-drop" if self.early_drop else ""
        return f"{self.scenario}-{self.limiter}{extra}-{self.load_x:g}x-r{self.rep}"

    @property
    def label(self) -> str:
        """Row label in the tables."""
        return f"{self.limiter}{' + early drop' if self.early_drop else ''}"

    def repeated(self, rep: int) -> RunSpec:
        """The same run, repetition ``rep``."""
        return replace(self, rep=rep)

    def dilated(self, k: float) -> RunSpec:
        """The same run at dilation ``k`` (rates / k; times of the simulated system x k)."""
        return replace(self, k=k, rate_rps=self.rate_rps / k)


def sweep(duration_s: float, loads: tuple[float, ...], limiters: tuple[str, ...]) -> list[RunSpec]:
    """Table 1: every limiter at every load multiple."""
    return [
        RunSpec("sweep", lim, x, x * CAPACITY_1X_RPS, duration_s) for x in loads for lim in limiters
    ]


def degrade(duration_s: float, limiters: tuple[str, ...]) -> list[RunSpec]:
    """Table 2: 2x offered, the backend 5x slower for the middle third."""
    third = duration_s / 3
    events = ((third, {"latency_multiplier": 5}), (2 * third, {"latency_multiplier": 1}))
    return [
        RunSpec("degrade", lim, 2, 2 * CAPACITY_1X_RPS, duration_s, events=events)
        for lim in limiters
    ]


def swing(duration_s: float, limiters: tuple[str, ...]) -> list[RunSpec]:
    """Table 3: 1600 rps offered, workers 8 -> 64 -> 8 in thirds."""
    third = duration_s / 3
    events = ((third, {"workers": 64}), (2 * third, {"workers": 8}))
    x = SWING_RPS / CAPACITY_1X_RPS
    return [RunSpec("swing", lim, x, SWING_RPS, duration_s, events=events) for lim in limiters]


def early_drop(duration_s: float, loads: tuple[float, ...]) -> list[RunSpec]:
    """The extra table: gradient with admission early drop on (off is the sweep's row)."""
    return [
        RunSpec("sweep", "gradient", x, x * CAPACITY_1X_RPS, duration_s, early_drop=True)
        for x in loads
    ]


def full_plan() -> list[RunSpec]:
    """``make experiment``: 110 runs per repetition (table 4: 40 of them, issue 28).

    Gradient2 and Vegas run in the degrade and the swing (where the limit has to
    move); the peers (issue 32) in every table; the early-drop rows
    (``early_drop()``, no effect in the last run that had them) are left out.
    """
    return [
        *sweep(10.0, SWEEP_LOADS, SWEEP_LIMITERS),
        *degrade(24.0, CHANGE_LIMITERS),
        *swing(24.0, CHANGE_LIMITERS),
        *hetero(10.0, HETERO_LOADS, HETERO_LIMITERS),
        *quiet(),
    ]


def quick_plan() -> list[RunSpec]:
    """``--quick``: the qualitative shape at 12x in well under a minute."""
    return sweep(5.0, (12,), ("fixed-16", "fixed-256", "gradient"))


def calibration_plan(duration_s: float = 6.0) -> list[RunSpec]:
    """The two heaviest loads on our own processes (12x sheds, 1600 rps proxied)."""
    return [
        RunSpec("calibrate", "fixed-256", 12, 12 * CAPACITY_1X_RPS, duration_s),
        RunSpec(
            "calibrate", "fixed-256", SWING_RPS / CAPACITY_1X_RPS, SWING_RPS, duration_s, workers=64
        ),
    ]


#: Table 4 (issue 28), heterogeneous endpoints: (path prefix, service ms, share
#: of traffic %, workers, deadline s). Each class has its own workers (the
#: simulator's ``paths``), sized so that 1x = ``HETERO_1X_RPS`` is 30-90 % of
#: each class's capacity: fast 1 x 2 ms (500 rps), medium 3 x 50 ms (60 rps),
#: slow 9 x 1 s (9 rps). Every tier of a class has the class's deadline.
HETERO_CLASSES: tuple[tuple[str, float, float, int, float], ...] = (
    ("/fast", 2.0, 70.0, 1, 0.4),
    ("/medium", 50.0, 26.0, 3, 1.0),
    ("/slow", 1000.0, 4.0, 9, 3.0),
)
HETERO_1X_RPS = 200.0
HETERO_LOADS = (0.5, 1, 4, 12)
HETERO_LIMITERS = ("gradient", "gradient-one", *FIXED, *PEERS)
#: The quiet spell then burst: fast requests at this rate, then this many slow ones at once.
QUIET_RPS, QUIET_S, BURST = 20.0, 10.0, 40


def hetero(duration_s: float, loads: tuple[float, ...], limiters: tuple[str, ...]) -> list[RunSpec]:
    """Table 4: the endpoint classes at each load multiple, every limiter."""
    return [
        RunSpec("hetero", lim, x, x * HETERO_1X_RPS, duration_s) for x in loads for lim in limiters
    ]


#: The quiet-spell rows: the real-time "direct" row sends the same schedule to
#: the simulator without a gateway.
QUIET_LIMITERS = ("gradient", "gradient-one", "fixed-16", "direct")


def quiet(limiters: tuple[str, ...] = QUIET_LIMITERS) -> list[RunSpec]:
    """Table 4's last row: a quiet spell of fast requests, then 40 slow ones at once."""
    return [RunSpec("quiet", lim, 1, QUIET_RPS, QUIET_S + 4.0) for lim in limiters]


def sim_paths(spec: RunSpec) -> str:
    """The simulator's ``--paths`` for ``spec`` (empty: one class)."""
    if spec.scenario not in ("hetero", "quiet"):
        return ""
    out = []
    for prefix, ms, _, workers, _ in HETERO_CLASSES:
        if spec.scenario == "quiet" and ms >= 1000:
            workers = BURST  # the burst runs in parallel directly: 1 s is "direct"
        out.append(f"{prefix}={workers}x{ms * spec.k:g}ms")
    return ",".join(out)


def with_limiters(plan: list[RunSpec], limiters: tuple[str, ...]) -> list[RunSpec]:
    """The runs of ``plan`` with these limiters; a limiter the plan lacks gets the gradient's cells.

    E.g. ``gradient-blind`` (the gradient without the loop-lag correction, ADR
    0010) or ``fixed-32`` run wherever the plan runs ``gradient``.
    """
    known = {s.limiter for s in plan}
    extra = [lim for lim in limiters if lim not in known]
    out = []
    for spec in plan:
        if spec.limiter in limiters:
            out.append(spec)
        if spec.limiter == "gradient":
            out += [replace(spec, limiter=lim) for lim in extra]
    return out


def expand_limiters(text: str) -> tuple[str, ...]:
    """``"gradient,fixed,peers"`` -> the names, groups (``LIMITER_GROUPS``) expanded, in order."""
    out: list[str] = []
    for name in (n.strip() for n in text.split(",")):
        for lim in LIMITER_GROUPS.get(name, (name,)):
            if lim and lim not in out:
                out.append(lim)
    return tuple(out)


def parse_limiter(limiter: str) -> tuple[str, int | None]:
    """``"fixed-64"`` -> ``("fixed", 64)``; ``"gradient"`` -> ``("gradient", None)``."""
    if limiter.startswith("fixed-"):
        return "fixed", int(limiter.removeprefix("fixed-"))
    return limiter, None
