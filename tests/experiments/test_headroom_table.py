"""The headroom table (issue 31 item 4): its rows, ratios, verdicts and docs block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from experiments.bench.headroom import (
    BEGIN,
    CLIENT_BOUND,
    END,
    ROWS,
    SHED_BODY,
    SHED_HEADERS,
    WIRE_OFF,
    floor_app,
    summarize,
    table,
    update_docs,
)

#: CPU us per response and responses/s per row (three repetitions each).
CPU = {"nginx": 40.0, "nginx-429": 10.0, "floor": 50.0, "aiohttp": 300.0, "proxied": 150.0,
       "shed": 45.0, WIRE_OFF: 90.0}  # fmt: skip
RPS = {"nginx": 20_000.0, "nginx-429": 60_000.0, "floor": 16_000.0, "aiohttp": 3_000.0,
       "proxied": 4_500.0, "shed": 17_000.0, WIRE_OFF: 9_000.0}  # fmt: skip


def _doc() -> dict[str, Any]:
    runs = [{"row": k, "rep": rep, "cpu_us": CPU[k] + rep, "rps": RPS[k] - rep, "cpu_util": 0.9}
            for rep in range(3) for k in CPU]  # fmt: skip
    return {
        "date": "2026-12-03 12:00 UTC", "commit": "abc1234", "client": "wrk -t1 -c16 on CPU 0",
        "backend": "backend: nginx serving a 1 KB file", "seconds": 5.0, "reps": 3,
        "loadavg": [[0.5, 0.5, 0.5], [1.0, 1.0, 1.0]], "runs": runs,
        "summary": summarize(runs, {k: 30.0 for k in CPU}), "before": None,
    }  # fmt: skip


def test_ratios_are_of_the_medians_and_verdicts_follow_the_targets() -> None:
    """Shed / floor, proxied / nginx and rate / aiohttp from medians; each target judged."""
    s = _doc()["summary"]
    assert s["ratios"]["shed_vs_floor"] == pytest.approx(46.0 / 51.0)
    assert s["ratios"]["proxied_vs_nginx"] == pytest.approx(151.0 / 41.0)
    assert s["ratios"]["proxied_rate_vs_aiohttp"] == pytest.approx(4_499.0 / 2_999.0)
    assert [t["met"] for t in s["targets"]] == [True, True, True, True, True, True]


def test_a_client_bound_shed_rate_is_judged_by_the_cores_capacity_and_says_so() -> None:
    """Shed row below ``CLIENT_BOUND`` CPU: the verdict is on 1 s / CPU per shed, labelled."""
    runs = [{**r, "cpu_util": 0.5} if r["row"] == "shed" else r for r in _doc()["runs"]]
    runs = [{**r, "rps": 9_000.0} if r["row"] == "shed" else r for r in runs]
    rate = summarize(runs, {})["targets"][2]
    assert CLIENT_BOUND == 0.9 and rate["met"] is True  # 1e6 / 46 us = 21,739/s
    assert (
        rate["measured"].startswith("21,739/s by capacity")
        and "9,000/s measured" in rate["measured"]
    )
    slow = [{**r, "cpu_us": 80.0} if r["row"] == "shed" else r for r in runs]
    assert summarize(slow, {})["targets"][2]["met"] is False  # 12,500/s


def test_the_table_has_exactly_the_issues_rows_in_order() -> None:
    """Six rows, the issue's labels, each with its CPU, rate and RSS; verdict lines after."""
    lines = table(_doc())
    start = next(i for i, line in enumerate(lines) if line.startswith("| what |"))
    rows = lines[start + 2 : start + 2 + len(ROWS)]
    assert [r.split(" | ")[0][2:] for r in rows] == [label for _, label in ROWS]
    assert lines[start + 2 + len(ROWS)] == ""
    assert any("0.90x the floor" in line for line in lines)
    assert sum(line.endswith("| met |") and "target" not in line for line in lines) == 6


def test_update_docs_replaces_only_the_marked_block(tmp_path: Path) -> None:
    """The block is appended once, then replaced in place; the text around it is kept."""
    doc = tmp_path / "bench.md"
    doc.write_text("# Bench\n\nnotes before\n")
    update_docs(_doc(), doc)
    first = doc.read_text()
    assert first.count(BEGIN) == 1 and first.startswith("# Bench\n\nnotes before\n")
    doc.write_text(first + "\nnotes after\n")
    update_docs(_doc(), doc)
    second = doc.read_text()
    assert second.count(BEGIN) == 1 and second.count(END) == 1
    assert second.endswith("notes after\n")


@pytest.mark.anyio
async def test_the_floor_app_answers_the_gateways_shed_bytes() -> None:
    """The floor sends a 429 with the gateway's shed headers and body, nothing more."""
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        raise AssertionError("the floor never reads")

    await floor_app({"type": "http"}, receive, send)
    assert sent[0]["status"] == 429 and sent[0]["headers"] == SHED_HEADERS
    assert sent[1]["body"] == SHED_BODY and len(sent) == 2


def test_the_lane_off_row_gives_its_ratio_and_sentence() -> None:
    """With the ``server.lane: false`` gateway in the run: proxied / lane-off, in the text."""
    from experiments.bench.headroom import LANE_OFF

    cpu = {**CPU, LANE_OFF: 200.0}
    runs = [{"row": k, "rep": rep, "cpu_us": cpu[k] + rep, "rps": 4_000.0, "cpu_util": 0.9}
            for rep in range(3) for k in cpu]  # fmt: skip
    doc = {**_doc(), "runs": runs, "summary": summarize(runs, {k: 30.0 for k in cpu})}
    assert doc["summary"]["ratios"]["proxied_vs_lane_off"] == pytest.approx(151.0 / 201.0)
    text = "\n".join(table(doc))
    assert "`server.lane: false`" in text and "on / off: 0.75x" in text
