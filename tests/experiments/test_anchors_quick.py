"""``python -m experiments.anchors --quick``: one short spike run end to end (real processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.anchors import plan as ap
from experiments.anchors import run
from experiments.anchors.analysis import COLLAPSE_BAR, analyse

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


def test_quick_spike_run_writes_records_and_a_report(tmp_path: Path) -> None:
    """The gradient row of the 4x spike at CI size: records, limit samples, RSS, a page.

    Its 4x run must not collapse: judged against the same harness's 1.4x run (so
    a machine busy with other work cannot fail it), and against the capacity
    too when neither run carries own-process flags (``experiments.sweep.checks``).
    """
    assert run.main(["--quick", "--only", "spike", "--limiters", "gradient", "--out",
                     str(tmp_path)]) == 0  # fmt: skip
    doc = json.loads((tmp_path / "results.json").read_text())
    assert [d["spec"]["name"] for d in doc["runs"]] == ["spike-gradient-1.4x", "spike-gradient-4x"]
    mild, four = doc["runs"]
    planned = ap.schedule(ap.spike(ap.QUICK, (4.0,), ("gradient",))[0])
    assert len(four["records"]) == len(planned) == 5374  # one record per scheduled request
    assert four["samples"] and four["rss"]
    a, calm = analyse(four), analyse(mild)
    # Collapse is goodput falling as the offered load grows: against the same harness's
    # 1.4x run just before (a same-run calibration), whatever the machine's speed.
    assert a["late_goodput_share"] >= COLLAPSE_BAR * calm["late_goodput_share"] > 0
    assert a["critical_share"] is not None and calm["critical_share"] is not None
    assert a["critical_share"] >= 0.9 * calm["critical_share"]
    if not a["bottleneck"]["flags"] and not calm["bottleneck"]["flags"]:
        # The harness measured the backend, not itself: the absolute bars too.
        assert not a["collapsed"]  # a starved harness may delay convergence, never collapse it
        assert a["critical_share"] >= 0.9
    page = (tmp_path / "anchors.md").read_text()
    assert "| 0.5x -> 4x | gradient |" in page and "## Targets" in page
