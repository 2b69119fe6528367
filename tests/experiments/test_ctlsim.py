"""The simulated-time model of generator -> gateway -> backend (experiments.ctlsim)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from experiments.ctlsim.__main__ import main
from experiments.ctlsim.des import GatewayCpu, Model, summarize
from experiments.sweep import plan


def _run(spec: plan.RunSpec) -> tuple[Model, dict[str, Any]]:
    model = Model(spec)
    return model, summarize(model, model.run())


def test_overload_loses_critical_behind_a_high_fixed_limit_only() -> None:
    """At 12x fixed-256 loses most critical requests; fixed-16 and gradient keep them."""
    served = {}
    for spec in plan.sweep(3.0, (12,), ("fixed-16", "fixed-256", "gradient")):
        _, out = _run(spec)
        served[spec.limiter] = out["critical_served"] / out["critical_sent"]
    assert served["fixed-256"] < 0.5
    assert served["fixed-16"] >= 0.99
    assert served["gradient"] >= 0.99


def test_every_request_gets_exactly_one_answer_and_permits_return() -> None:
    """Each request ends once (ok, shed or timed out) and no permit is left in flight."""
    spec = replace(plan.swing(6.0, ("gradient",))[0], duration_s=6.0)
    model = Model(spec)
    reqs = model.run()
    assert all(r.done_at is not None and r.status for r in reqs)
    assert model.limiter.inflight == 0
    assert model.queue.total == 0


def test_gradient_finds_the_capacity_step_within_a_second() -> None:
    """Workers 8 -> 64 at 2 s: the gradient limit passes 64 before 3 s (slow start)."""
    spec = replace(plan.swing(6.0, ("gradient",))[0], events=((2.0, {"workers": 64}),))
    model, _ = _run(spec)
    assert max(lim for t, lim in model.limits if t < 2.0) < 40
    assert max(lim for t, lim in model.limits if 2.0 <= t < 3.0) >= 64


def test_cli_prints_the_three_tables(capsys: pytest.CaptureFixture[str]) -> None:
    """The command line runs each scenario for the limiters given."""
    assert main(["--only", "degrade", "--limiters", "fixed-16,gradient-v1", "--seeds", "1"]) == 0
    out = capsys.readouterr().out
    assert "degrade" in out and "gradient-v1" in out


def test_gateway_cpu_delays_every_round_trip_and_keeps_one_answer_each() -> None:
    """A gateway that costs CPU adds its event-loop backlog to the RTTs the limiter sees;
    every request still ends once and no permit is left."""
    spec = plan.sweep(3.0, (1,), ("fixed-64",))[0]  # 250 rps, the limit never binds
    free = Model(spec)
    free.run()
    cpu = GatewayCpu.parse("1000,1000,1000,100")  # 3 ms per request at 250 rps: 75 % busy
    busy = Model(spec, cpu=cpu)
    reqs = busy.run()
    assert all(r.done_at is not None and r.status for r in reqs)
    assert busy.limiter.inflight == 0 and busy.queue.total == 0
    assert busy.loop_free > 0
    free_rtt, busy_rtt = free.limiter.rtt_min_s, busy.limiter.rtt_min_s
    assert free_rtt is not None and busy_rtt is not None
    assert busy_rtt >= free_rtt + 0.0019  # even the fastest pays forward + response (2 ms)


@pytest.mark.parametrize("text", ["1,2,3", "1,2,3,-4", "a,b,c,d"])
def test_gateway_cpu_rejects_bad_costs(text: str) -> None:
    """--gateway-us takes exactly four non-negative numbers."""
    with pytest.raises(ValueError):
        GatewayCpu.parse(text)


def test_queue_tolerance_variant_runs_the_old_tolerance() -> None:
    """``gradient-q1.5`` tolerates 1.5x in binding windows too, as before ADR 0012 (1.25)."""
    spec = replace(plan.sweep(2.0, (4,), ("gradient",))[0], duration_s=2.0)
    old, new = Model(replace(spec, limiter="gradient-q1.5")), Model(spec)
    assert getattr(old.limiter.algorithm, "queue_tolerance_binding", None) == 1.5
    assert getattr(new.limiter.algorithm, "queue_tolerance_binding", None) == 1.25
