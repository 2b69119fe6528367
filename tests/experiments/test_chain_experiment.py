"""The chain experiment's CI-safe parts: its analysis, report, naive retry loop and B's record."""

from __future__ import annotations

import math
import random

import pytest

from experiments.chain.analysis import (
    amplification,
    goodput,
    goodput_series,
    recovery_s,
    wasted_share,
)
from experiments.chain.naive import naive_call, naive_wait_s
from experiments.chain.report import END, START, merge, render
from experiments.chain.service_b import give_up_at

pytestmark = pytest.mark.anyio


def test_goodput_counts_200s_within_the_slo() -> None:
    """Goodput is the share of requests sent in the span answered 200 within the SLO."""
    records = [(0.1, 0.2, 200, 1, ""), (0.2, 1.5, 200, 2, ""), (0.3, 0.1, 429, 3, "deadline"),
               (0.4, None, 0, 4, "no answer"), (1.2, 0.1, 200, 5, "")]  # fmt: skip
    assert goodput(records, 0.0, 1.0, 1.0) == 0.25
    assert goodput_series(records, 2.0, 1.0, 1.0) == [0.25, 1.0]
    assert math.isnan(goodput(records, 5.0, 6.0, 1.0))


def test_amplification_attributes_attempts_to_their_client_request() -> None:
    """Attempts at B count for the client request they serve, whenever they arrive."""
    client = [(0.5, 0.1, 200, 1, ""), (0.6, 0.1, 200, 2, ""), (1.5, 0.1, 200, 3, "")]
    b = [(0.7, 0.8, 0.05, None, 200, 1), (1.2, 1.3, 0.05, None, 200, 1),
         (1.6, 1.7, 0.05, None, 200, 3), (9.0, None, 0.0, None, 0, 2)]  # fmt: skip
    assert amplification(client, b, 0.0, 1.0) == 1.5
    assert amplification(client, b, 1.0, 2.0) == 1.0


def test_wasted_share_is_busy_time_after_the_caller_gave_up() -> None:
    """Busy seconds of attempts ending after their give-up time, over all busy seconds."""
    b = [(0.0, 0.5, 0.1, 1.0, 200, 1), (0.0, 2.0, 0.3, 1.0, 200, 2),
         (0.0, 3.0, 0.6, None, 200, 3), (0.0, None, 0.0, 0.5, 0, 4)]  # fmt: skip
    assert wasted_share(b) == pytest.approx(0.3)
    assert wasted_share([]) == 0.0


def test_recovery_is_when_goodput_stays_above_target() -> None:
    """Recovery: from the trigger's end to the first bin after which goodput never drops."""
    series = [1.0, 1.0, 0.2, 0.1, 0.5, 0.96, 0.9, 1.0, 1.0]
    assert recovery_s(series, 1.0, 4.0, 0.95) == 3.0
    assert recovery_s([1.0, 0.1, 0.1], 1.0, 1.0, 0.95) is None
    assert recovery_s([1.0, 0.1, 1.0, 1.0], 1.0, 2.0, 0.95) == 0.0


async def test_naive_call_retries_three_times_on_5xx_and_errors() -> None:
    """The naive loop makes up to three attempts on 5xx/timeouts, stops at the first non-5xx."""
    import httpx

    answers: list[int | Exception] = [503, httpx.ConnectError("x"), 200]
    waits: list[float] = []

    async def send() -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def sleep(s: float) -> None:
        waits.append(s)

    assert await naive_call(send, rng=random.Random(1), sleep=sleep) == 200
    assert len(waits) == 2 and all(0 <= w <= 1.0 for w in waits)
    answers[:] = [500, 500, 502]
    assert await naive_call(send, rng=random.Random(1), sleep=sleep) == 502
    assert naive_wait_s(10, random.Random(1)) <= 1.0


def test_b_reads_the_earliest_give_up_time() -> None:
    """B's record takes the earliest of X-Deadline-Ms and the measurement headers."""
    headers = [(b"x-deadline-ms", b"500"), (b"x-chain-give-up", b"100.9"),
               (b"x-chain-attempt-give-up", b"bad")]  # fmt: skip
    assert give_up_at(headers, 100.0) == pytest.approx(100.5)
    assert give_up_at([], 100.0) is None


def _run(mode: str, kind: str) -> dict[str, object]:
    ok = [(i * 0.1, 0.1, 200, i, "") for i in range(60)]
    b = [(i * 0.1, i * 0.1 + 0.05, 0.05, i * 0.1 + 1, 200, i) for i in range(60)]
    return {"mode": mode, "kind": kind, "phase_s": 2.0, "duration_s": 6.0 if kind == "trigger"
            else 2.0, "loadavg_1m": 1.0, "cpu_s": {"gateway": 1.0, "a": 1.0, "b": 1.0},
            "client": ok, "b": b}  # fmt: skip


def test_report_renders_tables_and_keeps_the_written_parts() -> None:
    """The report fills the generated block and leaves the text around it alone."""
    doc = {"started": "now", "machine": {"cpu_model": "cpu", "cores": 2}, "b_capacity_rps": 41.7,
           "slo_s": 1.0, "runs": [_run(m, k) for m in ("naive", "both")
                                  for k in ("trigger", "overload")]}  # fmt: skip
    page = render(doc, f"# Title\n\nintro\n\n{START}\nold\n{END}\n\nreading\n")
    assert page.startswith("# Title\n\nintro\n\n" + START)
    assert page.endswith(END + "\n\nreading\n")
    assert "old" not in page
    assert "amplification <= 1.1x throughout: met (max 1.00x)" in page
    assert "naive chain stays collapsed after the trigger: no, it recovered" in page
    assert merge(None, "x").startswith("# The chain experiment")
