"""Whether a run measured the backend or ourselves (the bottleneck flags).

A run is *limited by our own processes* rather than by the simulated backend
when any of these holds (thresholds in real, undilated time):

- ``gen-lag``: the generator's schedule lag p99 > 10 ms;
- ``not-issued``: the generator failed to issue > 0.5 % of the schedule;
- ``gw-cpu``: the gateway (or the peer in its place, HAProxy or nginx) used
  > 90 % of a core (``/proc/<pid>/stat``);
- ``gw-loop``: the gateway's ``/snapshot`` took > 25 ms to answer at p99
  (its event loop was busy; the figure includes a little of the generator's
  own loop lag, so it errs towards flagging; a peer has no ``/snapshot``);
- ``sim-cpu``: the simulator used > 90 % of a core;
- ``steal``: the hypervisor took > 5 % of either CPU (``steal`` in
  ``/proc/stat``): the machine, not our processes, but it delays them alike;

Not a flag, a column: ``others``, per CPU the time busy with neither steal nor
our processes (CPU 0: simulator and generator; CPU 1: the gateway or peer):
other sessions' processes, plus the kernel's loopback network work that no
process is charged for. When the sweep runs at nice -20 (``favour_self``)
they mostly fill time ours leave idle, so a high value says how busy the
machine was, not that ours waited (``gen-lag`` and ``gw-loop`` say that).

The tables print these flags next to the number they affect.
"""

from __future__ import annotations

from typing import Any

from experiments._harness.stats import percentile

GEN_LAG_P99_MS = 10.0
NOT_ISSUED_SHARE = 0.005
CPU_SHARE = 0.90
LOOP_P99_MS = 25.0
STEAL_SHARE = 0.05


def bottleneck(doc: dict[str, Any]) -> dict[str, Any]:
    """The bottleneck signals of one run and the flags they raise."""
    gen = doc["summary"]["generator"]
    lag_p99 = gen["schedule_lag_ms"]["p99"] or 0.0
    not_issued = gen["not_issued"] / max(1, gen["scheduled"])
    answers = [s[4] for s in doc["samples"]]
    loop_p99 = percentile(answers, 99)
    cpu = doc["cpu_share"]
    flags = []
    if lag_p99 > GEN_LAG_P99_MS:
        flags.append("gen-lag")
    if not_issued > NOT_ISSUED_SHARE:
        flags.append("not-issued")
    if cpu.get("gateway", 0.0) > CPU_SHARE:
        flags.append("gw-cpu")
    if loop_p99 > LOOP_P99_MS:
        flags.append("gw-loop")
    if cpu.get("sim", 0.0) > CPU_SHARE:
        flags.append("sim-cpu")
    steal = doc.get("cpu_steal") or {}
    if any(v > STEAL_SHARE for v in steal.values()):
        flags.append("steal")
    others = others_share(doc)
    return {
        "gen_lag_p99_ms": round(lag_p99, 2),
        "gen_not_issued_share": round(not_issued, 4),
        "gen_not_issued": gen["not_issued"],
        "gen_cpu_us_per_request": gen["cpu_us_per_request"],
        "gateway_cpu_share": cpu.get("gateway"),
        "sim_cpu_share": cpu.get("sim"),
        "gateway_snapshot_p50_ms": round(percentile(answers, 50), 2),
        "gateway_snapshot_p99_ms": round(loop_p99, 2),
        "cpu_busy": doc.get("cpu_busy"),
        "cpu_steal": doc.get("cpu_steal"),
        "cpu_others": others,
        "flags": flags,
    }


def others_share(doc: dict[str, Any]) -> dict[str, float]:
    """Per CPU, the share busy with neither steal nor our own processes ({} without data)."""
    busy, steal, share = doc.get("cpu_busy") or {}, doc.get("cpu_steal") or {}, doc["cpu_share"]
    wall = doc.get("wall_s") or 0.0
    if not busy or not wall:
        return {}
    gen = (doc["summary"]["generator"].get("cpu_s") or 0.0) / wall
    ours = {"0": share.get("sim", 0.0) + gen, "1": share.get("gateway", 0.0)}
    return {cpu: round(max(0.0, busy[cpu] - steal.get(cpu, 0.0) - mine), 3)
            for cpu, mine in ours.items() if cpu in busy}  # fmt: skip


def calibration_ok(docs: list[dict[str, Any]]) -> bool:
    """True when no calibration run was limited by the generator or the gateway's CPU."""
    hard = {"gen-lag", "not-issued", "gw-cpu"}
    return all(not hard & set(bottleneck(d)["flags"]) for d in docs)
