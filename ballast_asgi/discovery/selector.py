"""A round-robin selector over a swappable instance list (used when no pool is configured).

``set_instances(instances)`` replaces the list in one assignment: new choices
use the new list, attempts already out finish on the upstream they chose.
``choose`` rotates over the list, skipping upstreams the request already
tried (``exclude``) and, for ``down_s`` seconds, those whose last attempt
could not connect, unless nothing else is left. A gateway with a pool
(``upstreams``) swaps the pool's list instead (``PoolSelector.set_instances``).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import Any

from ballast_asgi.core.outcome import AttemptOutcome
from ballast_asgi.core.types import Clock
from ballast_asgi.discovery.core.model import Instance
from ballast_asgi.proxy.upstream import Upstream

#: Stands in until the first version: never chosen (the gateway answers 503 first).
PLACEHOLDER = "http://127.0.0.1:9"


class ListSelector:
    """Round robin over the current instances, with a short memory of connect failures."""

    def __init__(self, urls: Sequence[str], *, clock: Clock = time.monotonic, down_s: float = 1.0):
        self.clock = clock
        self.down_s = down_s
        self._list: tuple[Upstream, ...] = tuple(Upstream.parse(u) for u in urls or [PLACEHOLDER])
        self._down: dict[Upstream, float] = {}
        self._next = 0

    def set_instances(self, instances: Sequence[Instance]) -> None:
        """Swap the list atomically (an empty list is refused: keep the last one)."""
        if not instances:
            raise ValueError("an empty instance list cannot be applied")
        self._list = tuple(Upstream.parse(i.url) for i in instances)
        self._down = {u: t for u, t in self._down.items() if u in self._list}

    def choose(self, ctx: Any, exclude: Collection[Upstream] = ()) -> Upstream:
        """The next upstream in turn that is neither excluded nor recently unreachable."""
        ups = self._list
        now = self.clock()
        fallback = None
        for _ in range(len(ups)):
            up = ups[self._next % len(ups)]
            self._next += 1
            if up in exclude:
                continue
            if self._down.get(up, 0.0) > now:
                fallback = fallback or up
                continue
            return up
        return fallback or ups[self._next % len(ups)]

    def report(
        self, upstream: Upstream, outcome: AttemptOutcome, rtt_s: float | None, now: float
    ) -> None:
        """A connect error keeps ``upstream`` out of turn for ``down_s``."""
        if outcome is AttemptOutcome.CONNECT_ERROR:
            self._down[upstream] = now + self.down_s
        else:
            self._down.pop(upstream, None)

    def report_body(self, upstream: Upstream, complete: bool, now: float) -> None:
        """Only connect errors take an upstream out of turn here."""

    def upstreams(self) -> Sequence[Upstream]:
        """The current list."""
        return self._list
