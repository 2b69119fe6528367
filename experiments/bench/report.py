"""Tables, target verdicts and the plot of ``make bench`` (from ``results.json``).

Every figure is a median over repetitions; latency added over direct is
``median(config) - median(direct)`` at the same offered rate. ``docs/bench.md``
is regenerated above the line ``<!-- notes -->``; what follows it (the
hand-written reading of a run) is kept.

    python -m experiments.bench.report runs/bench-<time>/results.json [--docs]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from experiments._harness.stats import median
from experiments.bench.saturation import table as saturation_table

MARKER = "<!-- notes -->"
GW = ("ballast-fixed", "ballast-gradient")


def pick(doc: dict[str, Any], config: str, rate: float, key: str) -> float:
    return median([r[key] for r in doc["grid"] if r["config"] == config and r["rate"] == rate])


def _held(doc: dict[str, Any], config: str, rate: float) -> bool:
    votes = [r["held"] for r in doc["grid"] if r["config"] == config and r["rate"] == rate]
    return bool(votes) and sum(votes) * 2 > len(votes)


def configs(doc: dict[str, Any]) -> list[str]:
    """Config names in the order they were started."""
    seen: list[str] = []
    for r in doc["grid"]:
        if r["config"] not in seen:
            seen.append(r["config"])
    return seen


def rates(doc: dict[str, Any]) -> list[float]:
    """The grid's offered rates, ascending."""
    return sorted({r["rate"] for r in doc["grid"]})


def held_rate(doc: dict[str, Any], config: str) -> tuple[float, bool]:
    """Highest rate held with every lower one held; True when the ramp ran out (>=)."""
    best = 0.0
    for rate in rates(doc):
        if not _held(doc, config, rate):
            return best, False
        best = rate
    ramp = [r for r in doc["ramp"] if r["config"] == config]
    for r in ramp:
        if not r["held"]:
            return best, False
        best = r["rate"]
    return best, True


def _ms(v: float) -> str:
    return "-" if math.isnan(v) else (f"{v:.2f}" if abs(v) < 10 else f"{v:,.0f}")


def _n(v: float) -> str:
    return "-" if math.isnan(v) else f"{v:,.0f}"


def cpu_table(doc: dict[str, Any]) -> list[str]:
    """Per config: CPU us/request at each rate, highest held rate, peak RSS."""
    rs = rates(doc)
    head = " | ".join(f"CPU us/req @{r:,.0f}" for r in rs)
    lines = [f"| config | {head} | highest held rps | peak RSS (VmHWM) MB |",
             "| --- " * (len(rs) + 3) + "|"]  # fmt: skip
    for c in configs(doc):
        cpu = " | ".join(_n(pick(doc, c, r, "cpu_us")) for r in rs)
        best, open_end = held_rate(doc, c)
        held = ("< " + f"{rs[0]:,.0f}") if best == 0 else f"{'>= ' if open_end else ''}{best:,.0f}"
        rss = doc["vmhwm_mb"].get(c)
        lines.append(f"| {c} | {cpu} | {held} | {'-' if rss is None else f'{rss:.0f}'} |")
    return lines


def latency_table(doc: dict[str, Any]) -> list[str]:
    """Per config: added p50 / p99 over direct (ms), and direct's own p50 / p99."""
    rs = rates(doc)
    head = " | ".join(f"+p50 / +p99 @{r:,.0f}" for r in rs)
    lines = [f"| config | {head} |", "| --- " * (len(rs) + 1) + "|"]
    for c in configs(doc):
        cells = []
        for r in rs:
            p50, p99 = pick(doc, c, r, "p50_ms"), pick(doc, c, r, "p99_ms")
            if c != "direct":
                p50 -= pick(doc, "direct", r, "p50_ms")
                p99 -= pick(doc, "direct", r, "p99_ms")
            mark = "" if _held(doc, c, r) else " (x)"
            cells.append(f"{_ms(p50)} / {_ms(p99)}{mark}")
        name = "direct (absolute p50 / p99)" if c == "direct" else c
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return lines


def _ratio(doc: dict[str, Any], gw: str, base: str) -> tuple[float, list[float]]:
    """Median CPU ratio over the rates where the baseline held (else its lowest rate)."""
    rs = [r for r in rates(doc) if _held(doc, base, r)] or rates(doc)[:1]
    ratios = [pick(doc, gw, r, "cpu_us") / pick(doc, base, r, "cpu_us") for r in rs]
    return median(ratios), rs


def issue18(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Issue 18's hot-path targets: <= 1.3x bare aiohttp at every rate; the saturation case."""
    out = []
    for gw in GW:
        per = [(r, pick(doc, gw, r, "cpu_us") / pick(doc, "bare-aiohttp", r, "cpu_us"))
               for r in rates(doc)]  # fmt: skip
        worst = max(x for _, x in per)
        shown = ", ".join(f"{x:.2f}x @{r:,.0f}" for r, x in per)
        target = f"{gw}: CPU/request <= 1.3x bare-aiohttp at every rate"
        out.append((target, shown, _verdict(worst <= 1.3, worst / 1.3)))
    sat = doc.get("saturation")
    if sat:
        cpu, rate = sat["cpu_ratio"], sat["rate_ratio"]
        out.append(("saturation (wrk, uvicorn form): CPU/request <= 1.5x bare-aiohttp",
                    f"{cpu:.2f}x", _verdict(cpu <= 1.5, cpu / 1.5)))  # fmt: skip
        out.append(("saturation (wrk, uvicorn form): rate >= 0.67x bare-aiohttp",
                    f"{rate:.2f}x", _short(100 * rate, 67)))  # fmt: skip
    return out


def verdicts(doc: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for each target of issue 6."""
    out = []
    for gw in GW:
        for base, bound in (("bare-aiohttp", 1.5), ("bare-httpx", 0.25)):
            r, rs = _ratio(doc, gw, base)
            at = ", ".join(f"{x:,.0f}" for x in rs)
            target = f"{gw}: CPU/request <= {bound}x {base}"
            out.append((target, f"{r:.2f}x (rates {at})", _verdict(r <= bound, r / bound)))
        best, open_end = held_rate(doc, gw)
        measured = f"{'>= ' if open_end else ''}{best:,.0f} rps"
        ok = _short(best, 3000)
        out.append((f"{gw}: highest held rate >= 3,000 rps", measured, ok))
    shed = median([b["cpu_us"] for b in doc["sheds"] if b["mode"] == "shed"])
    prox = median([b["cpu_us"] for b in doc["sheds"] if b["mode"] == "proxied"])
    rps = median([b["rps"] for b in doc["sheds"] if b["mode"] == "shed"])
    util = median([b["cpu_util"] for b in doc["sheds"] if b["mode"] == "shed"])
    share = shed / prox
    measured = f"{shed:.0f} us vs {prox:.0f} us = {share:.2f}"
    out.append(
        ("shed costs <= 1/4 of a proxied request", measured, _verdict(share <= 0.25, share / 0.25))
    )
    implied = 1e6 / shed
    measured = f"{rps:,.0f}/s measured at {100 * util:.0f} % of the core; {implied:,.0f}/s at 100 %"
    out.append((">= 10,000 sheds/s on one core", measured, _short(implied, 10_000)))
    caps = [c for c in doc["capacity"] if c["config"] == "cap-1024" and c["multiple"] == 12.0]
    if caps:
        mb = caps[0]["vmhwm_mb"]
        target = f"peak RSS < 256 MB during {caps[0]['seconds']:.0f} s at 12x"
        out.append((target, f"{mb:.0f} MB", _verdict(mb < 256, mb / 256)))
    soak = "separate: `python -m experiments.soak` (see the soak section below)"
    out.append(("RSS growth <= 5 % over a 10-minute soak at 2x", soak, "-"))
    return out


def _short(measured: float, target: float) -> str:
    """Verdict for a higher-is-better target: met, or missed by the shortfall."""
    if measured >= target:
        return "**met**"
    return f"**missed** by {100 * (1 - measured / target):.0f} % ({measured:,.0f} of {target:,.0f})"


def _verdict(ok: bool, factor: float) -> str:
    return "**met**" if ok else f"**missed** by {100 * (factor - 1):.0f} %"


def shed_table(doc: dict[str, Any]) -> list[str]:
    """Closed-loop proxied vs shed, medians."""
    lines = ["| mode | responses/s | gateway CPU us/response | gateway CPU use |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for mode in ("proxied", "shed"):
        bs = [b for b in doc["sheds"] if b["mode"] == mode]
        lines.append(
            f"| {mode} | {_n(median([b['rps'] for b in bs]))} | "
            f"{median([b['cpu_us'] for b in bs]):.0f} | "
            f"{100 * median([b['cpu_util'] for b in bs]):.0f} % |"
        )
    return lines


def capacity_table(doc: dict[str, Any]) -> list[str]:
    """The cap's effect at 3x and 12x."""
    lines = ["| config | load | critical served | critical p99 (served) ms | peak held | "
             "VmHWM MB | gateway CPU us/req | shed by reason | generator: sent, lag p99 | "
             "gateway CPU use / CPU 1 busy |",
             "| --- " * 10 + "|"]  # fmt: skip
    for c in doc["capacity"]:
        reasons = ", ".join(f"{k} {v:,}" for k, v in sorted(c["shed_by_reason"].items()))
        p99 = c["critical_p99_ms"]
        lines.append(
            f"| {c['config']} | {c['multiple']:.0f}x ({c['rate']:,.0f} rps, {c['seconds']:.0f} s)"
            f" | {c['critical_served']:,} / {c['critical_sent']:,} | "
            f"{'-' if p99 is None else f'{p99:.0f}'} | {c['peak_held']} | {c['vmhwm_mb']:.0f} | "
            f"{c['cpu_us_per_request']:.0f} | {reasons} | "
            f"{100 * c.get('sent_share', math.nan):.0f} %, {c['gen_lag_p99_ms']:.0f} ms | "
            f"{100 * c['cpu_util']:.0f} % / {100 * c.get('cpu1_busy', math.nan):.0f} % |"
        )
    return lines


def _busy(doc: dict[str, Any], rate: float, key: str) -> float:
    return median([x.get(key, math.nan) for x in doc["grid"] if x["rate"] == rate])


def generator_lines(doc: dict[str, Any]) -> list[str]:
    """Where the generator itself limited the run."""
    direct_best, open_end = held_rate(doc, "direct")
    lag = {r: median([x["gen_lag_p99_ms"] for x in doc["grid"] if x["rate"] == r])
           for r in rates(doc)}  # fmt: skip
    lags = ", ".join(f"{r:,.0f} rps: {v:.2f} ms" for r, v in lag.items())
    busy = ", ".join(
        f"{r:,.0f} rps: {100 * _busy(doc, r, 'cpu0_busy'):.0f} % / "
        f"{100 * _busy(doc, r, 'cpu1_busy'):.0f} %"
        for r in rates(doc)
    )
    ceiling = f">= {direct_best:,.0f}" if open_end else f"{direct_best:,.0f}"
    return [
        f"- Direct to the backend (generator + nginx on CPU 0) held {ceiling} rps: no config "
        "can be shown to hold more than that here; a held rate equal to direct's is "
        "generator-bound, not the proxy's ceiling.",
        f"- Generator schedule lag p99 (median over configs): {lags}.",
        f"- CPU 0 (generator + backend) / CPU 1 (proxy) busy, any process, median per rate: "
        f"{busy}.",
    ]


def write_report(doc: dict[str, Any], out: Path, docs_dir: Path | None) -> Path:
    """Write bench.md + bench.png next to the raw data, and into ``docs_dir`` if given."""
    from experiments.bench.plot import plot

    plot(doc, out / "bench.png")
    md = render(doc, "bench.png")
    (out / "bench.md").write_text(md)
    if docs_dir is None:
        return out / "bench.md"
    (docs_dir / "img").mkdir(parents=True, exist_ok=True)
    plot(doc, docs_dir / "img" / "bench.png")
    target = docs_dir / "bench.md"
    notes = ""
    if target.exists() and MARKER in target.read_text():
        notes = target.read_text().split(MARKER, 1)[1]
    target.write_text(render(doc, "img/bench.png") + "\n" + MARKER + notes)
    return target


def _load_end(doc: dict[str, Any]) -> str:
    end = doc.get("loadavg_end")
    return f", at the end {', '.join(f'{x:.2f}' for x in end)}" if end else ""


def render(doc: dict[str, Any], img: str) -> str:
    """The generated part of the report."""
    m = doc["machine"]
    v = ", ".join(f"{k} {x}" for k, x in m["versions"].items())
    a = doc["args"]
    parts = [
        "# Benchmark: the gateway's cost per request",
        "",
        "Generated by `make bench` (`python -m experiments.bench`); raw data in "
        "`runs/bench-*/results.json` (not in git).",
        "",
        f"- Machine: {m['cpu_model']}, {m['cores']} CPUs (KVM, shared with other sessions' "
        f"test runs: noisy; read medians and ratios); {m['platform']}; load average at "
        f"start {', '.join(f'{x:.2f}' for x in m['loadavg'])}{_load_end(doc)}.",
        f"- {v}. Date {m['date_utc']} UTC. Whole run {doc['elapsed_s']:.0f} s.",
        f"- Proxy under test pinned to CPU 1; generator (this process, aiohttp on uvloop, "
        f"open loop, constant arrivals) and backend pinned to CPU 0. {a['reps']} repetitions, "
        f"{a['seconds']} s per run, configs alternating; {'; '.join(doc['notes'])}.",
        "- `ballast-fixed`: the CLI with all four stages on (admission, queue, fixed limit "
        "1000, breaker + retry budget with buffered responses), nothing shed at these rates; "
        "`ballast-gradient`: the default gradient limiter.",
        "- Held: p99 < 50 ms, failures < 0.1 %, throughput >= 95 % of offered; highest held "
        "rate from the grid then a one-repetition ramp.",
        "",
        f"![bench]({img})",
        "",
        "## CPU per request, highest held rate, peak RSS (medians)",
        "",
        *cpu_table(doc),
        "",
        "## Latency added over direct, ms (medians; (x) = not held)",
        "",
        *latency_table(doc),
        "",
        "## Shed vs proxied (closed loop, 32 connections, raw client)",
        "",
        *shed_table(doc),
        "",
        "## Saturation: closed loop, the gateway as a user starts it",
        "",
        *(saturation_table(doc["saturation"]) if doc.get("saturation") else ["(not run)"]),
        "",
        "## Capacity cap at 3x and 12x the knee (simulator, ~270 rps)",
        "",
        *capacity_table(doc),
        "",
        "## Targets (issue 18: hot path)",
        "",
        "| target | measured | verdict |",
        "| --- | --- | --- |",
        *(f"| {t} | {m_} | {v_} |" for t, m_, v_ in issue18(doc)),
        "",
        "## Targets (issue 6)",
        "",
        "| target | measured | verdict |",
        "| --- | --- | --- |",
        *(f"| {t} | {m_} | {v_} |" for t, m_, v_ in verdicts(doc)),
        "",
        "## Where the generator was the bottleneck",
        "",
        *generator_lines(doc),
        "",
    ]
    return "\n".join(parts)


def main() -> None:
    """Re-render a report from a results.json."""
    p = argparse.ArgumentParser(prog="python -m experiments.bench.report")
    p.add_argument("results", type=Path)
    p.add_argument("--docs", action="store_true", help="also write docs/bench.md")
    a = p.parse_args()
    doc = json.loads(a.results.read_text())
    print(write_report(doc, a.results.parent, Path("docs") if a.docs else None))


if __name__ == "__main__":
    main()
