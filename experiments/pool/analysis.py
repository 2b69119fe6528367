"""What one pool run measured, from the generator's records and the gateway's snapshots (pure).

* **failed**: requests intended for the break window (from the fault until it
  is cleared, plus ``tail_s``) that got an error (5xx, reset, transport
  error), a 504, or were shed. **late**: a 2xx after the client's deadline, or
  no answer by then (the generator's timeout): on a busy shared machine these
  happen with nothing broken too, so they are reported apart, with the
  no-fault baseline. Requests the generator itself failed to issue are the
  generator's failure (``not_issued``), not the gateway's.
* **isolation**: the gateway's ``/snapshot`` is polled about every 100 ms;
  between two polls, the share of new attempts that went to the broken
  instance is one bin. Time to isolation is the end of the last bin inside
  the break whose share was >= 1 %, minus the fault's time (0 when no bin
  after the fault reached 1 %; ``None`` when the last bin of the break still
  did: not isolated within the break).
* **touched**: the broken instance's share of all attempts during the break.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

#: One poll: (seconds since the load started, cumulative attempts per instance).
Poll = tuple[float, Sequence[int]]
SHARE = 0.01


LATE = frozenset({"late", "timeout"})


def failures(records: Iterable[Any], start_s: float, end_s: float) -> dict[str, int]:
    """failed, late, sent and not_issued for requests intended in ``[start_s, end_s)``."""
    out = dict.fromkeys(("failed", "late", "sent", "not_issued"), 0)
    for r in records:
        if not start_s <= r.intended_s < end_s:
            continue
        outcome = str(r.outcome)
        if outcome == "not_issued":
            out["not_issued"] += 1
            continue
        out["sent"] += 1
        if outcome == "expired" and r.detail in LATE:
            out["late"] += 1
        elif outcome != "served":
            out["failed"] += 1
    return out


def bins(polls: Sequence[Poll], broken: int) -> list[tuple[float, float, float, int]]:
    """(start, end, broken share, attempts) between consecutive polls."""
    out = []
    for (t0, a), (t1, b) in itertools.pairwise(polls):
        total = sum(b) - sum(a)
        hit = b[broken] - a[broken]
        out.append((t0, t1, hit / total if total > 0 else 0.0, total))
    return out


def isolation_s(polls: Sequence[Poll], broken: int, fault_s: float, end_s: float) -> float | None:
    """Seconds from the fault to the end of the last >= 1 % bin in the break (see module)."""
    inside = [b for b in bins(polls, broken) if b[1] > fault_s and b[0] < end_s]
    if not inside:
        return None
    if inside[-1][2] >= SHARE:
        return None
    late = [end for _, end, share, total in inside if share >= SHARE and total > 0]
    return max(0.0, late[-1] - fault_s) if late else 0.0


def touched(polls: Sequence[Poll], broken: int, fault_s: float, end_s: float) -> float:
    """The broken instance's share of attempts between the fault and ``end_s``."""
    inside = [(t, c) for t, c in polls if fault_s <= t <= end_s]
    if len(inside) < 2:
        return 0.0
    (_, a), (_, b) = inside[0], inside[-1]
    total = sum(b) - sum(a)
    return (b[broken] - a[broken]) / total if total else 0.0


def median(values: Sequence[float | None]) -> float | None:
    """Median, with ``None`` (not isolated) ranked above every number; None if most are."""
    ranked = sorted(values, key=lambda v: (v is None, v or 0.0))
    mid = ranked[(len(ranked) - 1) // 2] if ranked else None
    if mid is None or len(ranked) % 2:
        return mid
    nxt = ranked[len(ranked) // 2]
    return None if nxt is None else statistics.mean([mid, nxt])
