"""Numbers derived from one raw run document, and the reference tables (seed 000).

Latencies are reported in undilated milliseconds (measured / k). Critical p99
is from each request's intended send time over **every completed critical
request** (served, expired, shed, errors), as the reference's 402-412 ms for
fixed-256 (past the 400 ms deadline) shows it was; the p99 over served
requests only is kept in the raw data too.
"""

from __future__ import annotations

from typing import Any

from experiments.sweep.checks import bottleneck

#: The loads of the reference's sweep (its columns); ours may add more (24x).
REFERENCE_LOADS = (1, 2, 4, 8, 12)
REFERENCE_SWEEP: dict[str, tuple[list[int], str]] = {
    "fixed-16": ([158, 165, 166, 165, 180], "735 / 735"),
    "fixed-64": ([122, 311, 374, 368, 385], "731 / 735"),
    "fixed-256": ([120, 402, 402, 406, 412], "3 / 735"),
    "gradient": ([164, 191, 179, 186, 207], "735 / 735"),
}
REFERENCE_DEGRADE = {
    "fixed-16": ("565 / 577", "16 -> 16"),
    "fixed-64": ("391 / 577", "64 -> 64"),
    "fixed-256": ("-", "-"),
    "gradient": ("559 / 577", "13 -> 31"),
}
REFERENCE_SWING = {
    "fixed-16": ("8,075", "16 -> 16"),
    "fixed-64": ("18,130", "64 -> 64"),
    "fixed-256": ("18,495", "256 -> 256"),
    "gradient": ("15,459", "17 -> 106"),
}


def limit_range(samples: list[list[float]], t0: float = -1e9, t1: float = 1e9) -> dict[str, Any]:
    """Lowest and highest limit outside probes (between t0 and t1), and the probes' pin."""
    samples = [s for s in samples if t0 <= s[0] <= t1]
    steady = [s[1] for s in samples if not (len(s) > 5 and s[5])]
    probes = [s[1] for s in samples if len(s) > 5 and s[5]]
    return {
        "min": min(steady) if steady else None,
        "max": max(steady) if steady else None,
        "probe_min": min(probes) if probes else None,
        "inflight_max": max((s[2] for s in samples), default=None),
        "queue_max": max((s[3] for s in samples), default=None),
    }


def served_by_phase(doc: dict[str, Any], phases: int = 3) -> list[int]:
    """Requests served (all tiers) per equal part of the run, by completion second."""
    timeline = doc["summary"]["timeline"]
    per_s = [sum(t["served"] for t in sec.values()) for sec in timeline]
    duration = doc["spec"]["duration_s"]
    edges = [round(duration * i / phases) for i in range(phases + 1)]
    edges[-1] = len(per_s)
    return [sum(per_s[edges[i] : edges[i + 1]]) for i in range(phases)]


def metrics(doc: dict[str, Any]) -> dict[str, Any]:
    """The numbers the tables and targets use, for one run."""
    k = doc["spec"]["k"]
    tiers = doc["summary"]["tiers"]
    crit = tiers.get("critical") or _critical_of_paths(tiers)
    p99_all = crit["latency_all_ms"]["p99"]
    p99_served = crit["latency_served_ms"]["p99"]
    sim = doc.get("sim_stats") or {}
    return {
        "classes": path_classes(tiers, k),
        "k": k,
        "duration_s": doc["spec"].get("duration_s"),
        "critical_sent": crit["sent"] + crit["not_issued"],
        "critical_served": crit["served"],
        "critical_p99_ms": None if p99_all is None else p99_all / k,
        "critical_p99_served_ms": None if p99_served is None else p99_served / k,
        "served_total": sum(t["served"] for t in tiers.values()),
        "sent_total": sum(t["sent"] + t["not_issued"] for t in tiers.values()),
        "shed_by_reason": _shed_by_reason(tiers),
        "sim_served": sim.get("served"),
        "gateway_cpu_share": doc["cpu_share"].get("gateway"),
        "rss_peak_mb": _rss_mb(doc),
        "sim_late": sim.get("finished_after_deadline"),
        "limit": limit_range(doc["samples"]),
        "limit_during_change": _during_change(doc),
        "bottleneck": bottleneck(doc),
    }


def _critical_of_paths(tiers: dict[str, Any]) -> dict[str, Any]:
    """The critical tiers of a path mix (``critical:/fast`` ...) as one: counts summed,
    p99 the largest of theirs (an upper bound; the table shows each class's own)."""
    crit = [t for name, t in tiers.items() if name.startswith("critical:")]

    def worst(key: str) -> float | None:
        values = [t[key]["p99"] for t in crit if t[key]["p99"] is not None]
        return max(values) if values else None

    return {
        "sent": sum(t["sent"] for t in crit),
        "not_issued": sum(t["not_issued"] for t in crit),
        "served": sum(t["served"] for t in crit),
        "latency_all_ms": {"p99": worst("latency_all_ms")},
        "latency_served_ms": {"p99": worst("latency_served_ms")},
    }


def path_classes(tiers: dict[str, Any], k: float) -> dict[str, dict[str, Any]]:
    """Per path of a path mix: served, sent, served p99 / max ms (undilated), critical share."""
    out: dict[str, dict[str, Any]] = {}
    for name, t in tiers.items():
        prio, sep, path = name.partition(":")
        if not sep:
            continue
        c = out.setdefault(path, {"served": 0, "sent": 0, "p99_ms": None, "max_ms": None,
                                  "critical_served": 0, "critical_sent": 0})  # fmt: skip
        c["served"] += t["served"]
        c["sent"] += t["sent"] + t["not_issued"]
        for key, field in (("p99_ms", "p99"), ("max_ms", "max")):
            v = t["latency_served_ms"].get(field)
            if v is not None:
                c[key] = max(c[key] or 0.0, v / k)
        if prio == "critical":
            c["critical_served"] += t["served"]
            c["critical_sent"] += t["sent"] + t["not_issued"]
    return out


def _rss_mb(doc: dict[str, Any]) -> float | None:
    """The gateway's (or peer's) peak RSS in MB at the end of the run (older runs: None)."""
    kb = (doc.get("rss_peak_kb") or {}).get("gateway")
    return None if not kb else round(kb / 1024, 1)


def _during_change(doc: dict[str, Any]) -> dict[str, Any] | None:
    events = [e[0] for e in doc["spec"]["events"]]
    if len(events) < 2:
        return None
    return limit_range(doc["samples"], events[0], events[1])


def _shed_by_reason(tiers: dict[str, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tiers.values():
        for reason, n in t["shed_by_reason"].items():
            out[reason] = out.get(reason, 0) + n
    return out


def flag_text(m: dict[str, Any]) -> str:
    """`` [gen-lag, gw-cpu]`` when the run was limited by our own processes, else ``""``;
    `` +`` after it for a cell taken from another run (``reps.merge``)."""
    flags = m["bottleneck"]["flags"]
    mark = " +" if m.get("merged") else ""
    return (f" [{', '.join(flags)}]" if flags else "") + mark


def fmt_ms(value: float | None) -> str:
    """A latency cell."""
    return "-" if value is None else f"{value:,.0f} ms"


def fmt_range(lim: dict[str, Any]) -> str:
    """``13 -> 31`` (plus the probe's pin when there was one)."""
    if lim["min"] is None:
        return "-"
    text = f"{lim['min']} -> {lim['max']}"
    if lim["probe_min"] is not None and lim["probe_min"] < lim["min"]:
        text += f" (probes pin {lim['probe_min']})"
    return text
