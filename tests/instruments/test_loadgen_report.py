"""Outcome classification, per-tier tallies and timelines, the summary and the CLI options."""

from __future__ import annotations

import io
import json
import math

import pytest

from ballast_tools.loadgen.__main__ import _config, _parser
from ballast_tools.loadgen.record import Outcome, Record, RunStats, classify, write_jsonl
from ballast_tools.loadgen.report import format_table, summarize
from ballast_tools.loadgen.runner import LoadConfig, RunResult
from ballast_tools.loadgen.schedule import DEFAULT_TIERS


@pytest.mark.parametrize(
    ("status", "reason", "latency_s", "expected"),
    [
        (200, None, 0.1, (Outcome.SERVED, "")),
        (204, None, 0.4, (Outcome.SERVED, "")),
        (200, None, 0.41, (Outcome.EXPIRED, "late")),
        (429, "queue_full", 0.01, (Outcome.SHED, "queue_full")),
        (503, "breaker_open", 0.01, (Outcome.SHED, "breaker_open")),
        (504, None, 0.4, (Outcome.EXPIRED, "504")),
        (500, None, 0.02, (Outcome.ERROR, "status:500")),
        (502, None, 0.02, (Outcome.ERROR, "status:502")),
    ],
)
def test_classify(
    status: int, reason: str | None, latency_s: float, expected: tuple[Outcome, str]
) -> None:
    """Served is 2xx within the deadline; a reason header is a shed; 504 and late are expired."""
    assert classify(status, reason, latency_s, deadline_s=0.4) == expected


def _stats() -> RunStats:
    stats = RunStats(DEFAULT_TIERS)
    for i in range(100):
        stats.issued(0, i * 0.01, 0.0001)
        stats.completed(0, i * 0.01 + 0.05, 0.05 + i * 0.001, Outcome.SERVED, "")
    stats.issued(1, 1.2, 0.0)
    stats.completed(1, 1.3, 0.1, Outcome.SHED, "limit")
    stats.issued(2, 1.5, 0.0)
    stats.completed(2, 4.6, 3.1, Outcome.EXPIRED, "timeout")
    stats.not_issued(2, 1.6, "behind")
    return stats


def _result(stats: RunStats) -> RunResult:
    cfg = LoadConfig(target="http://127.0.0.1:1/", rate_rps=50, duration_s=2)
    return RunResult(cfg, stats, scheduled=103, wall_s=5.0, cpu_s=0.0204, started_unix_s=1.0)


def test_tallies_and_summary_per_tier() -> None:
    """The summary counts each outcome per tier with latency percentiles in ms."""
    summary = summarize(_result(_stats()))
    crit, std, bulk = (summary["tiers"][n] for n in ("critical", "standard", "bulk"))
    assert crit["sent"] == crit["served"] == 100
    assert crit["latency_served_ms"]["p50"] == pytest.approx(99, rel=0.01)
    assert crit["latency_served_ms"]["p99"] == pytest.approx(148, rel=0.01)
    assert std["shed"] == 1 and std["shed_by_reason"] == {"limit": 1}
    assert bulk["expired"] == 1 and bulk["expired_by"] == {"timeout": 1}
    assert bulk["not_issued"] == 1 and bulk["not_issued_by"] == {"behind": 1}
    assert summary["generator"]["cpu_us_per_request"] == pytest.approx(200.0)
    json.dumps(summary, allow_nan=False)  # JSON-safe


def test_timeline_buckets_sends_by_intent_and_outcomes_by_completion() -> None:
    """Per-second rows: sent/not_issued by intended second, outcomes by completion second."""
    timeline = summarize(_result(_stats()))["timeline"]
    assert len(timeline) == 5
    assert timeline[0]["critical"]["sent"] == 100 and timeline[0]["critical"]["served"] == 95
    assert timeline[1]["critical"]["served"] == 5 and timeline[1]["standard"]["shed"] == 1
    assert timeline[1]["bulk"]["not_issued"] == 1 and timeline[4]["bulk"]["expired"] == 1


def test_table_lists_each_tier_and_the_generator_line() -> None:
    """The table has one row per tier and reports the generator's lag and CPU."""
    table = format_table(summarize(_result(_stats())))
    assert [line.split()[0] for line in table.splitlines()[2:5]] == [
        "critical",
        "standard",
        "bulk",
    ]
    assert "generator: 102/103 sent" in table and "us/req" in table


def test_take_window_resets_the_live_histograms() -> None:
    """The live window holds served latencies since the previous call only."""
    stats = _stats()
    assert stats.take_window()[0].count == 100
    assert stats.take_window()[0].count == 0


def test_records_write_as_jsonl_in_ms() -> None:
    """Each record is one JSON line; missing lag/latency are null."""
    out = io.StringIO()
    recs = [
        Record("critical", 0.5, 0.001, 0.0305, 200, Outcome.SERVED, ""),
        Record("bulk", 0.6, math.nan, math.nan, 0, Outcome.NOT_ISSUED, "behind"),
    ]
    assert write_jsonl(recs, out) == 2
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["latency_ms"] == 30.5 and first["outcome"] == "served"
    assert second["latency_ms"] is None and second["detail"] == "behind"


def test_cli_options_build_the_config() -> None:
    """CLI flags map onto LoadConfig (durations with units, mix and deadlines lists)."""
    args = _parser().parse_args(
        [
            *("--target", "http://127.0.0.1:8080/", "--rate", "2000", "--duration", "20s"),
            *("--poisson", "--mix", "10,30,60", "--deadlines", "500ms,1s,2s", "--seed", "4"),
            *("--records", "x.jsonl", "--connections", "100"),
        ]
    )
    cfg = _config(args)
    assert cfg.rate_rps == 2000 and cfg.duration_s == 20 and cfg.poisson and cfg.seed == 4
    assert [t.weight for t in cfg.tiers] == [10, 30, 60]
    assert [t.deadline_s for t in cfg.tiers] == [0.5, 1.0, 2.0]
    assert cfg.keep_records and cfg.max_inflight == 100
