"""The rate-limit experiment's arithmetic: schedules, perfect-bucket replay, admission."""

from __future__ import annotations

import random
from typing import Any

import pytest

from ballast_asgi.ratelimit.core.gcra import Limits
from experiments.ratelimit.analyze import admission, delta
from experiments.ratelimit.drive import Result, Shape, build, shifting, spikes, zipf_keys


def test_schedule_follows_rate_split_and_spikes() -> None:
    """A 100 rps, 2 s shape has 200 arrivals; shifting sends ~90 % to gateway 0 first."""
    plain = build(Shape(100.0, 2.0), seed=1)
    assert len(plain) == 200
    shifted = build(Shape(1000.0, 2.0, split=shifting(swap_s=1.0)), seed=1)
    first = [gw for t, gw, _ in shifted if t < 1.0]
    second = [gw for t, gw, _ in shifted if t >= 1.0]
    assert 0.85 < first.count(0) / len(first) < 0.95
    assert 0.85 < second.count(1) / len(second) < 0.95
    spiky = build(Shape(100.0, 2.0, boost=spikes(every_s=1.0, length_s=0.1, factor=10)), seed=1)
    assert len(spiky) > 1.5 * len(plain)


def test_zipf_keys_are_skewed() -> None:
    """The most frequent Zipf key is far more common than the median one."""
    pick = zipf_keys(1000)
    rng = random.Random(3)
    keys = [pick(rng) for _ in range(20_000)]
    assert keys.count("k0") > 50 * max(1, keys.count("k500"))


def test_admission_counts_over_and_under_against_the_perfect_bucket() -> None:
    """Admitting one extra request is +1 over; refusing a good one is -1 under."""
    limits = Limits(1.0, 2)

    def r(t: float, status: int) -> Result:
        return Result(t, 0, "k", status, 0.001, 0.0, "rate_limited" if status == 429 else "")

    results = [r(0.0, 200), r(0.1, 200), r(0.2, 200), r(1.5, 429), r(1.6, 429), r(-1, -1)]
    a = admission(results, limits)
    assert (a.issued, a.admitted, a.perfect, a.over, a.under) == (5, 3, 3, 1, 1)
    assert a.net_pct == 0.0 and a.over_pct == pytest.approx(100 / 3)
    timed_out = admission([*results, r(3.0, 0)], limits)
    assert timed_out.other == 1 and timed_out.perfect_answered == 3
    late = admission(results, limits, window=(1.0, 2.0))
    assert (late.issued, late.admitted, late.under) == (2, 0, 1)


def test_delta_sums_both_gateways_and_skips_late_answers() -> None:
    """Decisions by source and Redis trips are differences of two snapshots, summed."""
    before = [{"decisions": {"allowed/local": 5}, "redis_calls": {"lease/ok": 1}}] * 2
    after = [{"decisions": {"allowed/local": 15, "denied/degraded": 2},
              "redis_calls": {"lease/ok": 3, "gcra/late": 9}}] * 2  # fmt: skip
    d = delta(before, after)
    assert d == {"decisions": 24, "local": 20, "redis": 0, "degraded": 4, "trips": 4}


def test_clientbench_measures_cpu_per_call() -> None:
    """The client benchmark's meter divides this process's CPU by the calls it made."""
    import asyncio

    from experiments.ratelimit.clientbench import cpu_per_call

    seen: list[str] = []

    async def call(key: str) -> None:
        seen.append(key)
        sum(range(2000))  # some CPU, so the meter has something to read

    us = asyncio.run(cpu_per_call(call, calls=40, callers=4))
    assert len(seen) == 40 and set(seen) == {f"bench-{k}" for k in range(4)}
    assert 0.0 < us < 1e6


def test_waits_over_counts_the_histogram_delta_above_the_bound() -> None:
    """Decision waits over 2 ms during a run: the buckets above 0.002 s, both gateways."""
    from experiments.ratelimit.analyze import waits_over

    def snap(fast: int, slow: int) -> dict[str, object]:
        return {"decision_wait": {"buckets_s": {"0.001": fast, "0.002": 0, "0.005": slow}}}

    before = [snap(10, 1), snap(5, 0)]
    after = [snap(110, 3), snap(55, 0)]
    assert waits_over(before, after, 0.002) == (2, 152)


def test_outage_probe_times_decisions_before_and_after_redis_dies() -> None:
    """The in-process outage probe decides on a live Redis, kills it, and decides alone."""
    import uvloop

    from experiments.ratelimit.outage import one_mode

    alive, stopped = uvloop.run(one_mode("redis", 20, 2000.0))
    assert len(alive.waits) == len(stopped.waits) == 20
    assert alive.degraded < 20 and stopped.degraded == 20  # every decision alone once killed
    assert max(stopped.waits) < 1.0


def test_pair_probe_compares_two_drivers_with_a_perfect_bucket() -> None:
    """The in-process pair probe splits decisions between two drivers and replays them."""
    import uvloop

    from experiments.ratelimit.pairprobe import probe

    row = uvloop.run(probe("sync", 0.4, "even", 0.0, 0.0))
    assert 480 <= row["perfect"] <= 510  # 600 offered: the burst of 100 + 0.4 s at 1,000/s
    assert all(sum(counts.values()) > 200 for counts in row["decisions"])  # both gateways decided
    assert row["admitted"] <= 1.1 * row["perfect"]


def test_decision_reading_replays_the_perfect_bucket_over_decision_times() -> None:
    """Decided 0.5 s later for the last request than scheduled: over decision times that
    request had a token (1/s refill), over send times it had not; lateness is reported."""
    from experiments.ratelimit.decisiontimes import decision_reading

    limits = Limits(1.0, 1)
    schedule = [(0.0, 0, "k"), (0.5, 1, "k"), (1.0, 0, "k")]
    results = [
        Result(0.0, 0, "k", 200, 0.001, 0.0),
        Result(0.5, 1, "k", 429, 0.001, 0.0, "rate_limited"),
        Result(1.0, 0, "k", 200, 0.001, 0.0),
    ]
    traces = [[(0, 100.0, 200), (2, 101.5, 200)], [(1, 100.5, 429)]]
    row = decision_reading(results, schedule, traces, limits)
    assert (row["admitted"], row["perfect"]) == (2, 2)
    assert row["per_gw"] == [2, 0]
    assert row["late_p99_ms"] == pytest.approx(500.0)
    assert row["span_s"] == pytest.approx(1.5)
    assert admission(results, limits).over == 0


@pytest.mark.anyio
async def test_traced_app_records_each_sequenced_request_and_dumps_once() -> None:
    """The wrapper records (seq, arrival, status) for requests with x-seq; /_trace drains."""
    import json

    from experiments.ratelimit.traced import Traced

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 429, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = Traced(inner)
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    for headers in ([(b"x-seq", b"7")], []):
        await app({"type": "http", "path": "/r", "headers": headers}, receive, send)
    assert [(seq, status) for seq, _, status in app.records] == [(7, 429)]
    sent.clear()
    await app({"type": "http", "path": "/_trace", "headers": []}, receive, send)
    doc = json.loads(sent[1]["body"])
    assert [r[0] for r in doc["requests"]] == [7] and app.records == []
    assert {"decisions", "slow", "pauses", "collections", "gc_ms"} <= set(doc)


def test_run_subset_keeps_the_named_modes_and_the_no_limiter_pair() -> None:
    """``--only sync`` keeps none and sync (table 1) and slow-/stop-sync, nothing of redis."""
    from experiments.ratelimit.run import Subset

    keep = Subset(["sync"])
    assert keep.pairs == {"none", "sync"}
    configs = {n: {} for n in ("none", "local", "sync", "slow-sync", "stop-redis", "zipf")}
    assert set(keep(configs)) == {"none", "sync", "slow-sync"}
    assert Subset(["redis"]).pairs == {"none", "redis", "redis-naive", "zipf", "zipf-naive"}
    assert "local" in Subset(None).pairs
