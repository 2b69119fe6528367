"""Tables, targets, the bottleneck check and the plot of the rate-limit experiment."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ballast_asgi.ratelimit.core.gcra import Limits
from experiments.ratelimit.analyze import perfect_replay
from experiments.ratelimit.drive import Result

START, END = "<!-- results:start -->", "<!-- results:end -->"
MODES = ("redis", "lease", "sync")
Row = dict[str, Any]


def one_line(row: Row) -> str:
    """Progress line for one run."""
    a = row["admission"]
    d = row["decisions"]
    return (
        f"[{row['table']}] {row['pair']:<12} {row['scenario']:<9} "
        f"offered {row['offered_rps']:6.0f} rps"
        f"  admitted {a['admitted']:6d} perfect {a['perfect']:6d} ({a['net_pct']:+.2f} %,"
        f" +{a['over']}/-{a['under']}, {a['other']} unanswered)"
        f"  p50 {row['p50_ms']:.2f} ms p99 {row['p99_ms']:.2f} ms  trips {d['trips']:.0f}"
        f"  degraded {d['degraded']:.0f}  lag p99 {row['lag_p99_ms']:.2f} ms"
    )


def series(
    results: Sequence[Result], limits: Limits, bin_s: float = 0.25
) -> dict[str, list[float]]:
    """Admitted and perfect per second, in ``bin_s`` bins (for the plot)."""
    verdict = perfect_replay(results, limits)
    n = int(max(r.offset_s for r in results) / bin_s) + 1
    ours, best = [0.0] * n, [0.0] * n
    for i, r in enumerate(results):
        b = int(r.offset_s / bin_s)
        ours[b] += (r.status == 200) / bin_s
        best[b] += verdict.get(i, False) / bin_s
    return {"admitted": ours, "perfect": best, "bin_s": [bin_s]}


def _rows(
    rows: Sequence[Row], table: str, pair: str | None = None, scenario: str | None = None
) -> list[Row]:
    return [r for r in rows if r["table"] == table and (pair is None or r["pair"] == pair)
            and (scenario is None or r["scenario"] == scenario)]  # fmt: skip


def _med(values: Sequence[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def _mr(values: Sequence[float], fmt: str = "{:+.2f}") -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "n/a"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(_med(values))} ({fmt.format(min(values))}..{fmt.format(max(values))})"


def _share(d: dict[str, float], name: str) -> float:
    return d[name] / d["decisions"] if d["decisions"] else math.nan


def _trips(d: dict[str, float]) -> float:
    return d["trips"] / d["decisions"] if d["decisions"] else math.nan


def table_80(rows: Sequence[Row]) -> tuple[str, dict[str, dict[str, float]]]:
    """Table 1a: added latency, trips per request, local decisions at 80 % of the limit."""
    t1a = _rows(rows, "t1a")
    base = [r for r in t1a if r["pair"] == "none"]
    out = ["| mode | added p50 ms | added p99 ms | Redis trips / request | decisions local |",
           "| --- | --- | --- | --- | --- |"]  # fmt: skip
    stats: dict[str, dict[str, float]] = {}
    for mode in MODES:
        mine = [r for r in t1a if r["pair"] == mode]
        add50 = [r["p50_ms"] - b["p50_ms"] for r, b in zip(mine, base, strict=False)]
        add99 = [r["p99_ms"] - b["p99_ms"] for r, b in zip(mine, base, strict=False)]
        trips = [_trips(r["decisions"]) for r in mine]
        local = [100 * _share(r["decisions"], "local") for r in mine]
        stats[mode] = {"add50": _med(add50), "trips": _med(trips), "local": _med(local)}
        out.append(f"| {mode} | {_mr(add50)} | {_mr(add99)} | {_mr(trips, '{:.4f}')} | "
                   f"{_mr(local, '{:.1f}')} % |")  # fmt: skip
    b50 = _mr([b["p50_ms"] for b in base], "{:.2f}")
    out.append(f"\nNo limiter (same load, same runs): p50 {b50} ms.")
    return "\n".join(out), stats


def _median_run(found: Sequence[Row], value: Callable[[Row], float]) -> Row:
    """The repetition whose ``value`` is the (lower) median: its details stand for the cell."""
    ranked = sorted(found, key=value)
    return ranked[(len(ranked) - 1) // 2]


def _net(row: Row) -> float:
    return float(row["admission"]["net_pct"])


def table_150(rows: Sequence[Row]) -> tuple[str, dict[str, dict[str, float]]]:
    """Table 1b: admitted vs perfect at 150 % (even, shifting, burst), decisions without Redis.

    Each cell is the median over the repetitions with the range; the per-request counts and
    the decisions without Redis are those of the median run.
    """
    out = ["| mode | even split | shifting | burst | decisions without Redis (even) |",
           "| --- | --- | --- | --- | --- |"]  # fmt: skip
    stats: dict[str, dict[str, float]] = {}
    for mode in ("local", *MODES):
        cells, st = [], {}
        for scenario in ("even", "shifting", "burst"):
            found = _rows(rows, "t1b", mode, scenario)
            if not found:
                cells.append("-")
                continue
            a = _median_run(found, _net)["admission"]
            st[scenario] = _med([_net(r) for r in found])
            lost = sum(r["admission"]["other"] for r in found)
            unanswered = f"; {lost} unanswered in all runs" if lost else ""
            cells.append(f"{_mr([_net(r) for r in found])} % (+{a['over']} / -{a['under']}"
                         f"{unanswered})")  # fmt: skip
        even = _rows(rows, "t1b", mode, "even")
        d = _median_run(even, _net)["decisions"] if even else None
        without = f"{d['degraded']:.0f} of {d['decisions']:.0f}" if d else "-"
        stats[mode] = st
        out.append(f"| {mode} | {' | '.join(cells)} | {without} |")
    return "\n".join(out), stats


def table_breaker(rows: Sequence[Row]) -> str:
    """Table 2: naive three-misses breaker vs the rebuilt one with charge-back."""
    out = ["| breaker | mode | admitted vs perfect (median, range) | decisions without Redis |",
           "| --- | --- | --- | --- |"]  # fmt: skip
    for mode in ("redis", "lease", "zipf"):
        for kind, suffix in (("naive, no charge-back", "-naive"), ("rebuilt + charge-back", "")):
            table = "t2z" if mode == "zipf" else "t2"
            found = _rows(rows, table, f"{mode}{suffix}")
            net = [r["admission"]["net_pct"] for r in found]
            deg = [r["decisions"]["degraded"] for r in found]
            label = "redis, 10,000 Zipf keys" if mode == "zipf" else mode
            out.append(f"| {kind} | {label} | {_mr(net)} % | {_mr(deg, '{:.0f}')} |")
    return "\n".join(out)


def table_faults(rows: Sequence[Row], base_p99: float) -> tuple[str, dict[str, dict[str, float]]]:
    """Table 3: Redis 5 ms slower, and Redis stopped mid-run (median and range over the
    repetitions; the outage's over-admission and the slowest decision are the worst run's,
    the late decisions are summed over every run)."""
    out = ["| Redis | mode | admitted vs perfect | p99 added ms | degraded decisions | "
           "outage: over-admission x limit | outage: max latency ms | slowest decision ms | "
           "decisions waiting > 2 ms after the kill |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    stats: dict[str, dict[str, float]] = {}
    for cond in ("slow", "stop"):
        for mode in MODES:
            found = _rows(rows, "t3", f"{cond}-{mode}")
            if not found:
                continue
            d = _median_run(found, _net)["decisions"]
            outs = [r["outage"] for r in found if r.get("outage")]
            ox = _mr([o["over_x_limit"] for o in outs], "{:.2f}") if outs else "-"
            om = _mr([o["max_ms"] for o in outs], "{:.1f}") if outs else "-"
            waits = [r.get("decision_wait_max_ms", math.nan) for r in found]
            lates = [tuple(r.get("decision_waits_over_timeout", (0, 0))) for r in found]
            over, total = sum(x[0] for x in lates), sum(x[1] for x in lates)
            each = " + ".join(str(x[0]) for x in lates)
            late = f"{over} of {total}" + (f" ({each})" if len(lates) > 1 else "") if total else "-"
            stats[f"{cond}-{mode}"] = {
                "over_x": max((o["over_x_limit"] for o in outs), default=0.0),
                "max_ms": _med([o["max_ms"] for o in outs]) if outs else math.nan,
                "wait_ms": max(waits), "late": over, "decided": total, "runs": len(found),
            }  # fmt: skip
            label = "5 ms slower" if cond == "slow" else "stopped after 3 s"
            added = _mr([r["p99_ms"] - base_p99 for r in found])
            out.append(f"| {label} | {mode} | {_mr([_net(r) for r in found])} % | {added} | "
                       f"{d['degraded']:.0f} of {d['decisions']:.0f} | {ox} | {om} | "
                       f"{_mr(waits, '{:.2f}')} | {late} |")  # fmt: skip
    return "\n".join(out), stats


def targets(s80: dict[str, Any], s150: dict[str, Any], faults: dict[str, Any], timeout_ms: float,
            base_max_ms: float) -> str:  # fmt: skip
    """The issue's targets, each stated met or missed."""
    rows = []

    def add(name: str, value: str, ok: bool) -> None:
        rows.append(f"| {name} | {value} | {'met' if ok else 'missed'} |")

    for mode in ("lease", "sync"):
        add(f"{mode}: Redis trips / request <= 0.02 (80 %)", f"{s80[mode]['trips']:.4f}",
            s80[mode]["trips"] <= 0.02)  # fmt: skip
        add(f"{mode}: decisions local >= 99 % (80 %)", f"{s80[mode]['local']:.1f} %",
            s80[mode]["local"] >= 99.0)  # fmt: skip
    for mode in MODES:
        even, shift = s150[mode].get("even", math.nan), s150[mode].get("shifting", math.nan)
        add(f"{mode}: over-admission <= 1 % (even)", f"{even:+.2f} %", even <= 1.0)
        add(f"{mode}: over-admission <= 5 % (shifting)", f"{shift:+.2f} %", shift <= 5.0)
    for mode in MODES:
        f = faults.get(f"stop-{mode}")
        if f:
            add(f"{mode}: Redis stopped, over-admission <= 1x limit for the outage",
                f"{f['over_x']:.2f}x", f["over_x"] <= 1.0)  # fmt: skip
            add(f"{mode}: Redis stopped, no decision waits > {timeout_ms:g} ms after the kill "
                f"(in the gateway, {f['runs']} run(s))",
                f"{f['late']} of {f['decided']}, slowest {f['wait_ms']:.2f} ms",
                f["decided"] > 0 and f["late"] == 0)  # fmt: skip
            bound = base_max_ms + timeout_ms
            add(f"{mode}: Redis stopped, slowest <= no-limiter slowest + {timeout_ms:g} ms",
                f"{f['max_ms']:.1f} ms vs {bound:.1f} ms", f["max_ms"] <= bound)  # fmt: skip
    for mode in ("lease", "sync"):
        add(f"{mode}: added p50 <= 0.1 ms (80 %)", f"{s80[mode]['add50']:+.3f} ms",
            s80[mode]["add50"] <= 0.1)  # fmt: skip
    return "\n".join(["| target | measured | |", "| --- | --- | --- |", *rows])


def bottleneck(rows: Sequence[Row]) -> str:
    """Where the generator or the machine limited the runs."""
    lag = max(r["lag_p99_ms"] for r in rows)
    missed = sum(r["not_issued"] for r in rows)
    gen = max(r["gen_cpu_share"] for r in rows)
    gw = max(r["gw_cpu_share"] for r in rows)
    worst = max(rows, key=lambda r: r["lag_p99_ms"])
    lines = [
        f"- Generator: schedule lag p99 at most {lag:.2f} ms (worst: {worst['pair']} "
        f"{worst['scenario']}); {missed} requests not issued on time in all runs; its CPU at "
        f"most {100 * gen:.0f} % of one core.",
        f"- Gateways: the two processes of a pair used at most {100 * gw:.0f} % of one core "
        "together (2 cores on this machine, shared with the generator, Redis, the upstream and "
        "other work).",
    ]
    if lag > 5 or missed:
        lines.append("- The generator fell behind in some runs: those runs offered less than "
                     "planned, and their latency includes the generator's own delay.")  # fmt: skip
    if lag > 5 and gen < 0.5 and gw < 0.9:
        lines.append("- Neither the generator nor the gateways used their CPU while falling "
                     "behind: the machine was the bottleneck (other processes held the cores; "
                     "see the load average above). Latencies and timeouts in such runs measure "
                     "the machine; the comparisons with the perfect bucket leave unanswered "
                     "requests out, and a Redis call that waited for a core counts as a miss "
                     "of the 2 ms deadline (degraded decisions).")  # fmt: skip
    elif not (lag > 5 or missed):
        lines.append("- The generator kept its schedule: offered load is as planned.")
    return "\n".join(lines)


def render(rows: Sequence[Row], scale: Any, meta: dict[str, Any]) -> str:
    """Every table as Markdown."""
    lim = scale.limits
    t80, s80 = table_80(rows)
    t150, s150 = table_150(rows)
    none_even = _rows(rows, "t1b", "none", "even")
    base_p99 = _med([r["p99_ms"] for r in none_even])
    base_max = _med([r["max_ms"] for r in none_even])
    t3, s3 = table_faults(rows, base_p99)
    factor = scale.factor
    return "\n\n".join(
        [
            f"Run {meta['date']}, {meta['elapsed_s']} s, Python {meta['python']}, "
            f"{meta['cpus']} CPUs, "
            f"load average {meta['loadavg']} at the end, `{meta['platform']}`. Reproduce with "
            "`make experiment-ratelimit` "
            f"(`python -m experiments.ratelimit.run --scale {factor}"
            f"{' --keep-burst' if scale.keep_burst else ''}`).",
            f"**Scale.** Every rate is the reference's times {factor:g}"
            f"{' (the burst is kept at 100)' if scale.keep_burst else ''}: the limit is "
            f"{lim.rate_per_s:g}/s with a burst of {lim.burst} for one key (reference 1,000/s), "
            f"80 % = {0.8 * lim.rate_per_s:g} rps, 150 % = {1.5 * lim.rate_per_s:g} rps, burst "
            f"spikes to {5 * lim.rate_per_s:g} rps; the 10,000-key row is {3000 * factor:g} rps "
            "with 20/s and a burst of 5 per key. Two gateway processes share one redis-server on "
            "loopback; open-loop load from one process on the lean HTTP/1.1 client "
            "(`ballast_tools.loadgen.lean`).",
            "### 1. One limit across two gateways\n\nAt 80 % of the limit, against the same load "
            "with no limiter (median of the repetitions, range in brackets):\n\n" + t80,
            "At 150 % of the limit: admitted compared with a perfect single bucket replayed over "
            f"the same requests, the median of {scale.reps_150} run(s) with the "
            "range (plus = over the limit, minus = good requests refused; the median run's "
            "per-request counts in brackets; requests that got no answer in 2 s, or another "
            "shed, are left out of the comparison and counted as unanswered). Shifting sends "
            "90 % to one gateway and swaps every 5 s; burst is 80 % with spikes to 5x, "
            "shifting every 3 s."
            "\n\n" + t150,
            "### 2. The Redis breaker, before and after\n\nAt 150 %, even split, alternating, "
            "three runs each. The naive breaker stops asking Redis for a second after three misses "
            "in a row and charges nothing back; the rebuilt one opens on half the calls and at "
            "least "
            "five failing within 100 ms, stays open 100 ms, probes once, and charges back.\n\n"
            + table_breaker(rows),
            "### 3. When Redis is slow or gone\n\n150 %, even split, "
            f"{scale.reps_150} run(s) of each, alternating. Slow: a delaying TCP "
            "proxy adds 5 ms to every Redis answer for the whole run. Stopped: Redis is killed "
            "3 s into a 10.5 s run. p99 added is against the no-limiter run at the same "
            "load.\n\n" + t3,
            "### Targets (same run)\n\n" + targets(s80, s150, s3, 2.0, base_max),
            "### Bottlenecks\n\n" + bottleneck(rows),
        ]
    )


def write_docs(path: Path, text: str) -> None:
    """Replace the results block of docs/ratelimit.md."""
    doc = path.read_text()
    head, _, rest = doc.partition(START)
    _, _, tail = rest.partition(END)
    path.write_text(f"{head}{START}\n{text}\n{END}{tail}")


def plot(rows: Sequence[Row], path: Path, scale: Any) -> None:
    """Admitted per second in the shifting scenario, each shared mode against the perfect bucket."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    perfect_drawn = False
    for mode in MODES:
        found = _rows(rows, "t1b", mode, "shifting")
        if not found:
            continue
        s = found[0]["series"]
        xs = [i * s["bin_s"][0] for i in range(len(s["admitted"]))]
        if not perfect_drawn:
            ax.plot(xs, s["perfect"], color="black", linewidth=2, label="perfect bucket")
            perfect_drawn = True
        ax.plot(xs, s["admitted"], label=mode, alpha=0.8)
    ax.set_xlabel("seconds (traffic swaps gateways every 5 s)")
    ax.set_ylabel("admitted per second")
    ax.set_title(f"Shifting load at 150 % of {scale.limits.rate_per_s:g}/s over two gateways")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
