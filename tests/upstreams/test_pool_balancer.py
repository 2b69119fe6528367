"""Balancer cores: power of two choices, smooth weighted round robin, peak EWMA."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import pytest

from ballast_asgi.upstreams.core.balancer import (
    PeakEwma,
    SmoothRoundRobin,
    p2c,
    peak_ewma,
    weighted_index,
)


@dataclass
class Node:
    name: str
    weight: float = 1.0
    outstanding: int = 0
    rtt_ewma_s: float = 0.0


def test_weighted_index_follows_weights() -> None:
    """Draws land in proportion to the weights."""
    rng = random.Random(1)
    counts = Counter(weighted_index([1.0, 3.0], rng) for _ in range(20_000))
    assert 0.72 < counts[1] / 20_000 < 0.78


def test_p2c_prefers_fewer_outstanding() -> None:
    """Of two candidates the one with fewer requests in flight wins every time."""
    busy, idle = Node("busy", outstanding=10), Node("idle")
    rng = random.Random(2)
    assert all(p2c([busy, idle], rng) is idle for _ in range(100))


def test_p2c_spreads_evenly_when_equal() -> None:
    """With equal load and weights the picks are spread over all candidates."""
    nodes = [Node(str(i)) for i in range(3)]
    rng = random.Random(3)
    counts = Counter(p2c(nodes, rng).name for _ in range(9_000))
    assert all(2_500 < counts[str(i)] < 3_500 for i in range(3))


def test_p2c_weighted_keeps_share_under_load() -> None:
    """With light queues a weight-3 node takes about three times the traffic of a weight-1 one."""
    nodes = [Node("a", weight=3.0), Node("b"), Node("c")]
    rng = random.Random(4)
    counts: Counter[str] = Counter()
    for _ in range(10_000):
        pick = p2c(nodes, rng)
        pick.outstanding += 1
        counts[pick.name] += 1
        for n in nodes:  # each completes a share of its queue
            n.outstanding = int(n.outstanding * 0.8)
    assert 2.3 < counts["a"] / counts["b"] < 3.7
    assert 0.8 < counts["b"] / counts["c"] < 1.25


def test_p2c_one_candidate_and_empty() -> None:
    """One candidate is returned as is; none is an error."""
    only = Node("only")
    assert p2c([only], random.Random(0)) is only
    with pytest.raises(ValueError, match="at least one"):
        p2c([], random.Random(0))


def test_peak_ewma_cost_weighs_latency() -> None:
    """Peak-EWMA scoring prefers the fast node even with a longer queue."""
    slow = Node("slow", outstanding=0, rtt_ewma_s=1.0)
    fast = Node("fast", outstanding=3, rtt_ewma_s=0.01)
    assert all(p2c([slow, fast], random.Random(i), peak_ewma) is fast for i in range(20))


def test_round_robin_smooth_weights() -> None:
    """nginx's smooth weighted round robin: 5,1,1 gives a a b a c a a."""
    nodes = [Node("a", 5.0), Node("b"), Node("c")]
    rr = SmoothRoundRobin()
    picks = "".join(rr.pick(nodes, key=lambda n: n.name).name for _ in range(7))
    assert picks == "aabacaa"


def test_round_robin_forgets_removed() -> None:
    """State of an instance that left is dropped; the rest carry on."""
    rr = SmoothRoundRobin()
    a, b = Node("a"), Node("b")
    assert [rr.pick([a, b], key=lambda n: n.name).name for _ in range(2)] == ["a", "b"]
    rr.forget({"a"})
    assert rr.pick([a], key=lambda n: n.name) is a


def test_peak_ewma_jumps_up_and_decays() -> None:
    """A peak is taken at once; lower samples pull it down with the time constant."""
    e = PeakEwma(tau_s=1.0)
    assert e.observe(0.1, 0.0) == 0.1
    assert e.observe(0.5, 0.1) == 0.5
    after = e.observe(0.1, 1.1)  # one tau later: about 63 % of the way down
    assert 0.22 < after < 0.27
    with pytest.raises(ValueError, match="tau_s"):
        PeakEwma(0.0)
