"""``python -m experiments.sweep --quick``: the experiment's qualitative shape, end to end.

Three short runs at 12x overload (fixed-16, fixed-256, gradient) against the
real simulator and gateway processes, at time dilation k = 4 so that a two-core
machine busy with other work still measures the backend rather than the harness. The
thresholds keep a wide margin: the full run (``make experiment``) holds the
precise targets.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from experiments.sweep import run
from experiments.sweep.metrics import metrics

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, float, Path]:
    """Run ``--quick`` once into a temporary directory: metrics by limiter, wall time, dir."""
    out = tmp_path_factory.mktemp("exp-quick")
    started = time.monotonic()
    assert run.main(["--quick", "--out", str(out)]) == 0
    wall_s = time.monotonic() - started
    doc = json.loads((out / "results.json").read_text())
    return {d["spec"]["limiter"]: metrics(d) for d in doc["runs"]}, wall_s, out


def _served_share(m: dict[str, object]) -> float:
    served, sent = m["critical_served"], m["critical_sent"]
    assert isinstance(served, int) and isinstance(sent, int) and sent > 0
    return served / sent


def test_fixed_256_loses_most_critical_traffic_at_12x(quick: tuple[dict, float, Path]) -> None:
    """With the limit far above the knee, the backend's queue makes most critical requests late."""
    runs, _, _ = quick
    assert _served_share(runs["fixed-256"]) < 0.5


def test_gradient_serves_nearly_all_critical_traffic_at_12x(
    quick: tuple[dict, float, Path],
) -> None:
    """The adaptive limit keeps the backend's queue short, so critical requests make it.

    On a machine busy with other work our own processes can be starved (the run
    then carries own-process flags, as the report does): the gradient must still
    serve several times fixed-256's share; the 95 % bar applies when the run
    measured the backend, not the starved harness.
    """
    runs, _, _ = quick
    gradient, fixed_256 = _served_share(runs["gradient"]), _served_share(runs["fixed-256"])
    assert gradient >= max(0.25, 5 * fixed_256)
    if not runs["gradient"]["bottleneck"]["flags"]:
        assert gradient >= 0.95


def test_gradient_limit_stays_near_the_knee(quick: tuple[dict, float, Path]) -> None:
    """Outside probes the gradient limit ends far below fixed-256 (8 workers' knee is ~8-16)."""
    runs, _, _ = quick
    limit = runs["gradient"]["limit"]
    assert isinstance(limit, dict) and limit["min"] is not None
    assert limit["min"] <= 32


def test_quick_mode_is_quick_and_writes_its_report(quick: tuple[dict, float, Path]) -> None:
    """Quick mode offers 15 s of load in all (3 runs of 5 s) and finishes without hanging.

    The wall-time guard is a hang guard, so generous: process starts on a shared
    two-core machine at a load average of 25 took over a minute, and a gateway
    pinned to a CPU where another session benchmarks took 40 s to start (322 s in all).
    """
    runs, wall_s, out = quick
    assert set(runs) == {"fixed-16", "fixed-256", "gradient"}
    doc = json.loads((out / "results.json").read_text())
    assert sum(d["spec"]["duration_s"] for d in doc["runs"]) == 15.0
    assert wall_s < 900.0


def test_quick_mode_writes_report_and_plots_next_to_its_data(
    quick: tuple[dict, float, Path],
) -> None:
    """``--quick`` writes results.md and the plots into its own directory, not into docs/."""
    _, _, out = quick
    assert "critical p99" in (out / "results.md").read_text()
    assert (out / "img" / "exp_sweep.png").stat().st_size > 0
