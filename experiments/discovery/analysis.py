"""Matching registrations with the versions each gateway applied (wall-clock times)."""

from __future__ import annotations

import time
from typing import Any

from experiments._harness.cpu import busy_all, cpu_s, cpu_ticks

#: gateway name -> config version number -> (applied_at, instance URLs)
Applied = dict[str, dict[int, tuple[float, frozenset[str]]]]


def merge_history(applied: Applied, gateway: str, snapshot: dict[str, Any]) -> None:
    """Add a gateway snapshot's ``discovery.history`` to ``applied``."""
    seen = applied.setdefault(gateway, {})
    for entry in (snapshot.get("discovery") or {}).get("history", []):
        seen[int(entry["config_version"])] = (
            float(entry["applied_at"]),
            frozenset(entry["instances"]),
        )


def first_applied(applied: Applied, url: str, since: float, *, present: bool) -> float | None:
    """When the last gateway applied a version with ``url`` (or without it) after ``since``."""
    times = []
    for versions in applied.values():
        hits = [at for at, urls in versions.values() if at >= since and (url in urls) == present]
        if not hits:
            return None
        times.append(min(hits))
    return max(times) if times else None


def latencies_ms(
    applied: Applied, marks: list[tuple[str, float]], *, present: bool
) -> tuple[list[float], int]:
    """Mark-to-applied-in-every-gateway latencies (ms), and how many never applied."""
    out, missing = [], 0
    for url, at in marks:
        done = first_applied(applied, url, at, present=present)
        if done is None:
            missing += 1
        else:
            out.append(max(0.0, done - at) * 1000.0)
    return out, missing


class CpuMeter:
    """CPU used by groups of processes and by this one (the load generator), and machine-wide."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.start_wall = time.monotonic()
        self.start_self = time.process_time()
        self.start_ticks = cpu_ticks()
        self.groups = {name: {pid: _cpu_s(pid) for pid in pids} for name, pids in groups.items()}

    def usage(self) -> dict[str, Any]:
        """Each group's CPU in cores over the measured time, and each CPU's busy share."""
        wall = max(1e-9, time.monotonic() - self.start_wall)
        out: dict[str, Any] = {
            "generator": round((time.process_time() - self.start_self) / wall, 3)
        }
        for name, pids in self.groups.items():
            used = sum(max(0.0, _cpu_s(pid) - start) for pid, start in pids.items())
            out[name] = round(used / wall, 3)
        out["machine_busy_share_per_cpu"] = busy_all(self.start_ticks)
        out["wall_s"] = round(wall, 1)
        return out


def _cpu_s(pid: int) -> float:
    """``cpu_s(pid)``, 0 once the process is gone."""
    try:
        return cpu_s(pid)
    except OSError:
        return 0.0
