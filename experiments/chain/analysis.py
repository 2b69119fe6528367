"""The chain experiment's numbers from raw records (pure: lists in, numbers out).

Client records: ``(sent, latency_s, status, id, reason)`` per original client request,
``sent`` in seconds from the run's start (the intended send time: the load
is open-loop), ``latency_s`` to the final answer (None: none), ``status``
the final status (0: no answer), ``id`` the request's ``X-Chain-Id``,
``reason`` its ``X-Ballast-Reason`` (or ``no answer``).

B records: ``(arrived, ended, busy_s, give_up, status, id)`` per attempt that
reached B (``ended`` None and ``busy_s`` 0: still queued or in service),
times in seconds from the run's start, ``give_up`` when its caller stopped
waiting (None: unknown, counted as still waiting), ``id`` the
client request it serves (every layer passes ``X-Chain-Id`` on).

* **goodput** of a bin: the share of the requests sent in it that got a 200
  within the client's SLO;
* **amplification**: attempts arriving at B (whenever they arrive) per client
  request, for the client requests sent in a span;
* **wasted work**: B's busy seconds on attempts that ended after their caller
  gave up, as a share of all of B's busy seconds;
* **recovery**: seconds from the trigger's end to the start of the first bin
  from which every later bin has goodput >= the target (None: never).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

ClientRecord = tuple[float, float | None, int, int, str]
BRecord = tuple[float, float | None, float, float | None, int, int]


def goodput(records: Sequence[ClientRecord], start: float, end: float, slo_s: float) -> float:
    """Share of requests sent in ``[start, end)`` answered 200 within ``slo_s`` (nan: none)."""
    sent = [r for r in records if start <= r[0] < end]
    if not sent:
        return math.nan
    good = sum(1 for r in sent if r[2] == 200 and r[1] is not None and r[1] <= slo_s)
    return good / len(sent)


def goodput_series(
    records: Sequence[ClientRecord], duration_s: float, bin_s: float, slo_s: float
) -> list[float]:
    """Goodput per ``bin_s`` bin of send time over ``[0, duration_s)``."""
    n = math.ceil(duration_s / bin_s - 1e-9)
    return [goodput(records, i * bin_s, (i + 1) * bin_s, slo_s) for i in range(n)]


def amplification(
    client: Sequence[ClientRecord], b: Sequence[BRecord], start: float, end: float
) -> float:
    """Attempts at B for the client requests sent in ``[start, end)``, per request (nan: none)."""
    ids = {r[3] for r in client if start <= r[0] < end}
    if not ids:
        return math.nan
    return sum(1 for r in b if r[5] in ids) / len(ids)


def wasted_share(b: Sequence[BRecord], start: float = -math.inf, end: float = math.inf) -> float:
    """B's busy seconds on attempts ended after their caller gave up / all busy seconds."""
    busy = wasted = 0.0
    for arrived, ended, busy_s, give_up, _, _ in b:
        if not start <= arrived < end:
            continue
        busy += busy_s
        if give_up is not None and ended is not None and ended > give_up:
            wasted += busy_s
    return wasted / busy if busy > 0 else 0.0


def recovery_s(
    series: Sequence[float], bin_s: float, trigger_end_s: float, target: float
) -> float | None:
    """Seconds from ``trigger_end_s`` until goodput stays >= ``target`` (None: it never does)."""
    first = round(trigger_end_s / bin_s)
    tail = series[first:]
    if not tail:
        return None
    recovered_at: int | None = None
    for i in range(len(tail) - 1, -1, -1):
        value = tail[i]
        if math.isnan(value) or value >= target:
            recovered_at = i
        else:
            break
    if recovered_at is None:
        return None
    return recovered_at * bin_s
