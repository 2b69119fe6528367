"""docs/chain.md's generated part from a run's raw numbers (pure: dict in, markdown out).

Only the text between ``<!-- generated:start -->`` and ``<!-- generated:end -->``
is replaced (``merge``), so the hand-written explanation and reading around
it survive a rerun.
"""

from __future__ import annotations

import math
from typing import Any

from experiments.chain.analysis import (
    amplification,
    goodput,
    goodput_series,
    recovery_s,
    wasted_share,
)

START, END = "<!-- generated:start -->", "<!-- generated:end -->"
TARGET_GOODPUT = 0.95
TARGET_RECOVERY_S = 2.0
TARGET_AMPLIFICATION = 1.1
TARGET_WASTED = 0.01
BIN_S = 1.0
LABELS = {"naive": "naive (3 x 3 x 3 attempts)", "server": "ballast server-side only",
          "both": "ballast on both ends"}  # fmt: skip


def _pct(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.1f} %"


def _x(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.2f}x"


def summarize(run: dict[str, Any], slo_s: float) -> dict[str, Any]:
    """The headline numbers of one run."""
    client, b, p = run["client"], run["b"], run["phase_s"]
    if run["kind"] == "overload":
        d = run["duration_s"]
        return {"goodput": goodput(client, 0, d, slo_s), "amp": amplification(client, b, 0, d),
                "wasted": wasted_share(b), "attempts": len(b), "sent": len(client)}  # fmt: skip
    spans = {"before": (0.0, p), "trigger": (p, 2 * p), "after": (2 * p, 3 * p)}
    series = goodput_series(client, 3 * p, BIN_S, slo_s)
    bins2 = [amplification(client, b, t, t + 2.0) for t in range(0, int(3 * p), 2)]
    return {
        "goodput": {k: goodput(client, s, e, slo_s) for k, (s, e) in spans.items()},
        "amp": {k: amplification(client, b, s, e) for k, (s, e) in spans.items()},
        "amp_max_2s": max((a for a in bins2 if not math.isnan(a)), default=math.nan),
        "wasted": wasted_share(b),
        "series": series,
        "recovery_s": recovery_s(series, BIN_S, 2 * p, TARGET_GOODPUT),
    }


def render_generated(doc: dict[str, Any]) -> str:
    """The generated tables."""
    slo = doc["slo_s"]
    by: dict[tuple[str, str], dict[str, Any]] = {}
    for run in doc["runs"]:
        by[(run["mode"], run["kind"])] = {**run, "sum": summarize(run, slo)}
    modes = [m for m in LABELS if (m, "trigger") in by]
    host = doc["machine"]
    lines = [START, "", f"Run started {doc['started']} on {host.get('cpu_model', 'unknown')} "
             f"({host.get('cores', '?')} CPUs), B at {doc['b_capacity_rps']:.1f} "
             f"requests/s, client SLO {slo * 1000:.0f} ms.", ""]  # fmt: skip
    lines += [*_trigger_table(by, modes), "", *_series_table(by, modes), ""]
    lines += [*_overload_table(by, modes), "", *_targets(by), "", END]
    return "\n".join(lines)


def _trigger_table(by: dict[tuple[str, str], Any], modes: list[str]) -> list[str]:
    out = ["**Trigger run** (0.8x B's capacity; B's workers halved in the middle phase):", "",
           "| configuration | goodput before / during / after | amplification before / during"
           " / after (max 2 s bin) | wasted work | recovery after the trigger | load avg |"
           " CPU s gateway / A / B |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for m in modes:
        run = by[(m, "trigger")]
        s = run["sum"]
        g = " / ".join(_pct(s["goodput"][k]) for k in ("before", "trigger", "after"))
        a = " / ".join(_x(s["amp"][k]) for k in ("before", "trigger", "after"))
        rec = "never (in the run)" if s["recovery_s"] is None else f"{s['recovery_s']:.0f} s"
        cpu = " / ".join(f"{run['cpu_s'][k]:.1f}" for k in ("gateway", "a", "b"))
        out.append(f"| {LABELS[m]} | {g} | {a} ({_x(s['amp_max_2s'])}) | {_pct(s['wasted'])} "
                   f"| {rec} | {run['loadavg_1m']:.1f} | {cpu} |")  # fmt: skip
    return out


def _series_table(by: dict[tuple[str, str], Any], modes: list[str]) -> list[str]:
    if not modes:
        return []
    n = len(by[(modes[0], "trigger")]["sum"]["series"])
    p = by[(modes[0], "trigger")]["phase_s"]
    head = " | ".join(f"{i * BIN_S:.0f}{'*' if p <= i * BIN_S < 2 * p else ''}" for i in range(n))
    out = ["**Goodput over time** (share answered 200 within the SLO, per 1 s of send time; "
           "`*` = trigger on):", "", f"| configuration | {head} |",
           "| --- |" + " --- |" * n]  # fmt: skip
    for m in modes:
        series = by[(m, "trigger")]["sum"]["series"]
        cells = " | ".join("" if math.isnan(v) else f"{100 * v:.0f}" for v in series)
        out.append(f"| {LABELS[m]} | {cells} |")
    return out


def _overload_table(by: dict[tuple[str, str], Any], modes: list[str]) -> list[str]:
    out = ["**3x overload** (3x B's capacity, steady):", "",
           "| configuration | goodput | amplification | wasted work (of B's busy time) |"
           " attempts at B / client requests | CPU s gateway / A / B |",
           "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for m in modes:
        run = by.get((m, "overload"))
        if run is None:
            continue
        s = run["sum"]
        cpu = " / ".join(f"{run['cpu_s'][k]:.1f}" for k in ("gateway", "a", "b"))
        out.append(f"| {LABELS[m]} | {_pct(s['goodput'])} | {_x(s['amp'])} | {_pct(s['wasted'])}"
                   f" | {s['attempts']} / {s['sent']} | {cpu} |")  # fmt: skip
    return out


def _targets(by: dict[tuple[str, str], Any]) -> list[str]:
    both, over = by.get(("both", "trigger")), by.get(("both", "overload"))
    out = ["**Targets** (ballast on both ends):", ""]
    if both is not None:
        s = both["sum"]
        amp = max([*(v for v in s["amp"].values() if not math.isnan(v)), s["amp_max_2s"]])
        rec = s["recovery_s"]
        out.append(
            f"- amplification <= {TARGET_AMPLIFICATION}x throughout: "
            f"{'met' if amp <= TARGET_AMPLIFICATION else 'missed'} (max {amp:.2f}x)"
        )
        out.append(f"- goodput >= 95 % within {TARGET_RECOVERY_S:.0f} s of the trigger's end: "
                   f"{'met' if rec is not None and rec <= TARGET_RECOVERY_S else 'missed'} "
                   f"({'never' if rec is None else f'{rec:.0f} s'})")  # fmt: skip
    if over is not None:
        w = over["sum"]["wasted"]
        out.append(
            f"- wasted work <= 1 % of B's busy time at 3x: "
            f"{'met' if w <= TARGET_WASTED else 'missed'} ({_pct(w)})"
        )
    naive = by.get(("naive", "trigger"))
    if naive is not None:
        after = naive["sum"]["goodput"]["after"]
        stayed = naive["sum"]["recovery_s"] is None or after < TARGET_GOODPUT
        out.append(
            f"- naive chain stays collapsed after the trigger: "
            f"{'yes' if stayed else 'no, it recovered'} (goodput after {_pct(after)})"
        )
    return out


def merge(existing: str | None, generated: str) -> str:
    """``existing`` with its generated part replaced (or a bare page when there is none)."""
    if existing is None or START not in existing or END not in existing:
        return f"# The chain experiment\n\n{generated}\n"
    head, rest = existing.split(START, 1)
    return head + generated + rest.split(END, 1)[1]


def render(doc: dict[str, Any], existing: str | None = None) -> str:
    """docs/chain.md: ``existing`` with fresh generated tables."""
    return merge(existing, render_generated(doc))
