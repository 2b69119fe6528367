"""Load generator path mix (issue 28 item 4): tiers per (priority, path), heads, CLI."""

from __future__ import annotations

import argparse
import random

import pytest

from ballast_tools.loadgen.__main__ import _paths
from ballast_tools.loadgen.runner import LoadConfig, _LeanClient, _with_path
from ballast_tools.loadgen.schedule import build_schedule, make_path_tiers


def test_path_tiers_split_the_share_by_priority_and_carry_deadlines() -> None:
    """Two paths x three priorities: weights multiply, names say both, deadline per path."""
    tiers = make_path_tiers([("/fast", 90.0, 0.4), ("/slow", 10.0, 3.0)])
    assert [t.name for t in tiers][:3] == ["critical:/fast", "standard:/fast", "bulk:/fast"]
    assert sum(t.weight for t in tiers) == pytest.approx(1.0)
    slow = [t for t in tiers if t.path == "/slow"]
    assert sum(t.weight for t in slow) == pytest.approx(0.1)
    assert {t.deadline_s for t in slow} == {3.0}
    assert tiers[0].priority_header == "critical"


def test_schedule_draws_paths_by_share() -> None:
    """A seeded schedule sends about each path's share."""
    tiers = make_path_tiers([("/fast", 70.0, 0.4), ("/slow", 30.0, 3.0)])
    sched = build_schedule(1000.0, 10.0, random.Random(1), tiers=tiers)
    slow = sum(1 for i in sched.tier_ids if tiers[i].path == "/slow")
    assert 0.27 < slow / len(sched) < 0.33


def test_lean_heads_carry_each_tier_path_and_priority() -> None:
    """The lean client's request line has the tier's path; X-Priority is the priority."""
    tiers = make_path_tiers([("/slow", 1.0, 3.0)])
    cfg = LoadConfig(target="http://127.0.0.1:9/api/?x=1", rate_rps=1, duration_s=1, tiers=tiers)
    client = _LeanClient(cfg, tiers, lambda *a: None)
    assert client.heads[0].startswith(b"GET /api/slow?x=1 HTTP/1.1\r\n")
    assert b"X-Priority: critical\r\n" in client.heads[0]
    assert _with_path("http://h/", "") == "http://h/"


@pytest.mark.parametrize("bad", ["/fast", "/fast=70", "fast=70:1s", "/fast=x:1s", "/fast=1:soon"])
def test_cli_paths_reject_malformed_items(bad: str) -> None:
    """--paths items need /PATH=SHARE:DEADLINE; others are usage errors naming --paths."""
    with pytest.raises(argparse.ArgumentTypeError, match="--paths"):
        _paths(bad)


def test_path_tiers_reject_bad_classes() -> None:
    """A path without '/', a negative share or a zero deadline is refused."""
    for paths in ([("fast", 1.0, 1.0)], [("/a", -1.0, 1.0)], [("/a", 1.0, 0.0)], []):
        with pytest.raises(ValueError):
            make_path_tiers(paths)
