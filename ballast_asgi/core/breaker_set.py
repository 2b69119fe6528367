"""Breakers keyed per route template or rule group (pure).

One failing route must not shed another route's traffic, so the breaker stage
asks ``BreakerSet.get(key)`` for the request's key (``RequestContext.route``:
the matched route template in an app, a rule group, or None). Each key gets
its own ``Breaker`` made by the same factory on first use. Keys are bounded
(``max_keys``, default 64): past it, new keys share the default breaker, so a
client cannot grow the set by inventing paths (keys are templates, not paths).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ballast_asgi.core.breaker import Breaker, TransitionListener

DEFAULT_MAX_KEYS = 64


class BreakerSet:
    """A default breaker plus one per key, created lazily."""

    def __init__(self, factory: Callable[[], Breaker], *, max_keys: int = DEFAULT_MAX_KEYS) -> None:
        if max_keys < 0:
            raise ValueError(f"max_keys must be >= 0, got {max_keys}")
        self._factory = factory
        self._max_keys = max_keys
        self.default = factory()
        self._by_key: dict[str, Breaker] = {}
        self._listener: TransitionListener | None = None

    def get(self, key: str | None) -> Breaker:
        """The breaker for ``key`` (None: the default)."""
        if key is None:
            return self.default
        breaker = self._by_key.get(key)
        if breaker is None:
            if len(self._by_key) >= self._max_keys:
                return self.default
            breaker = self._by_key[key] = self._factory()
            breaker.set_on_transition(self._listener)
        return breaker

    def __iter__(self) -> Iterator[Breaker]:
        yield self.default
        yield from self._by_key.values()

    def set_on_transition(self, listener: TransitionListener | None) -> None:
        """Call ``listener(old, new, at)`` on every transition of every breaker."""
        self._listener = listener
        for breaker in self:
            breaker.set_on_transition(listener)

    def snapshot(self, now: float) -> dict[str, Any]:
        """The default breaker's state, plus each keyed one's under ``routes``."""
        snap = self.default.snapshot(now)
        snap["routes"] = {key: b.snapshot(now) for key, b in sorted(self._by_key.items())}
        return snap
