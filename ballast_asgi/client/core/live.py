"""The live ``BallastTransport`` objects of this process, for ``/_ballast/snapshot``.

Every transport registers itself here (weakly: a dropped client is
forgotten), so an app that ``install()``-ed ballast shows its outgoing calls
in the ``client`` section of its snapshot and in its metrics without any
wiring. Standard library only.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol


class _Snapshots(Protocol):
    def snapshot(self, now: float | None = None) -> dict[str, Any]: ...


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
#: The per-host event counters, summed in the snapshot and exported as metrics.
EVENTS = (
    "sent",
    "retried",
    "retry_denied",
    "throttled",
    "backed_off",
    "no_budget",
    "shed",
    "failed",
)


def register(transport: _Snapshots) -> None:
    """Remember ``transport`` while it lives."""
    _LIVE.add(transport)


def transports() -> list[Any]:
    """The transports alive now, oldest first is not guaranteed."""
    return list(_LIVE)


def client_section() -> dict[str, Any]:
    """The ``client`` section: totals over every live transport and each host's state.

    ``budget`` sums the hosts' retry budgets: ``balance`` (retries they would
    grant now), ``granted`` / ``denied`` (totals), ``hosts_exhausted`` (hosts
    with less than one retry left).
    """
    section: dict[str, Any] = {"transports": 0, **dict.fromkeys(EVENTS, 0), "hosts": {}}
    budget = {"balance": 0.0, "granted": 0, "denied": 0, "hosts_exhausted": 0}
    for transport in transports():
        doc = transport.snapshot()
        section["transports"] += 1
        for name in EVENTS:
            section[name] += doc[name]
        for key, state in doc["hosts"].items():
            name, n = key, 2
            while name in section["hosts"]:
                name, n = f"{key}#{n}", n + 1
            section["hosts"][name] = state
            balance = state["retry_budget"]["balance"]
            budget["balance"] += balance
            budget["hosts_exhausted"] += balance < 1.0
    budget["granted"], budget["denied"] = section["retried"], section["retry_denied"]
    budget["balance"] = round(budget["balance"], 3)
    section["budget"] = budget
    return section
