"""Breakers keyed per route (pure).

One failing route must not shed another route's traffic, so the breaker stage
asks ``BreakerSet.get(key)`` for the request's route name
(``RequestContext.route.name``: a configured route, the app's route template,
or an automatic first-segment group; ``core/routes.py``). Each key gets its
own ``Breaker`` on first use, made by its own factory (a route with breaker
overrides) or the common one. Keys are bounded (``max_keys``, default 64; the
gateway passes its route table's capacity): past it, new keys share the
default breaker, so a client cannot grow the set by inventing paths (route
names are bounded by the route table, never raw paths). ``max_keys = 0``:
one breaker for everything (``breaker.scope: global``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ballast_asgi.core.breaker import Breaker, BreakerState, TransitionListener

#: Called on every transition of any breaker of the set: (key, old, new, when); key None
#: for the default breaker.
KeyedListener = Callable[[str | None, BreakerState, BreakerState, float], None]

DEFAULT_MAX_KEYS = 64


class BreakerSet:
    """A default breaker plus one per key, created lazily."""

    def __init__(
        self,
        factory: Callable[[], Breaker],
        *,
        max_keys: int = DEFAULT_MAX_KEYS,
        factories: Mapping[str, Callable[[], Breaker]] | None = None,
    ) -> None:
        if max_keys < 0:
            raise ValueError(f"max_keys must be >= 0, got {max_keys}")
        self._factory = factory
        self._factories = dict(factories or {})
        self._max_keys = max_keys
        self.default = factory()
        self._by_key: dict[str, Breaker] = {}
        self._listener: KeyedListener | None = None

    def get(self, key: str | None) -> Breaker:
        """The breaker for ``key`` (None: the default)."""
        if key is None:
            return self.default
        breaker = self._by_key.get(key)
        if breaker is None:
            if len(self._by_key) >= self._max_keys:
                return self.default
            breaker = self._by_key[key] = self._factories.get(key, self._factory)()
            breaker.set_on_transition(self._bound(key))
        return breaker

    @property
    def keyed(self) -> bool:
        """Whether keys get breakers of their own (False: ``breaker.scope: global``)."""
        return self._max_keys > 0

    def items(self) -> list[tuple[str, Breaker]]:
        """The keyed breakers created so far, by key."""
        return sorted(self._by_key.items())

    def open_keys(self, now: float) -> list[str]:
        """The keys whose breaker is open now, sorted."""
        return [k for k, b in sorted(self._by_key.items()) if b.state(now) is BreakerState.OPEN]

    def worst(self, now: float) -> Breaker:
        """The breaker in the most open state (open, then half-open, then the default)."""
        rank = {BreakerState.OPEN: 2, BreakerState.HALF_OPEN: 1, BreakerState.CLOSED: 0}
        return max(self, key=lambda b: rank[b.state(now)])

    def __iter__(self) -> Iterator[Breaker]:
        yield self.default
        yield from self._by_key.values()

    def set_on_transition(self, listener: KeyedListener | None) -> None:
        """Call ``listener(key, old, new, at)`` on every transition of every breaker."""
        self._listener = listener
        self.default.set_on_transition(self._bound(None))
        for key, breaker in self._by_key.items():
            breaker.set_on_transition(self._bound(key))

    def _bound(self, key: str | None) -> TransitionListener | None:
        listener = self._listener
        if listener is None:
            return None

        def on_transition(old: BreakerState, new: BreakerState, at: float) -> None:
            listener(key, old, new, at)

        return on_transition

    def snapshot(self, now: float) -> dict[str, Any]:
        """The default breaker's state, plus each keyed one's under ``routes``."""
        snap = self.default.snapshot(now)
        snap["routes"] = {key: b.snapshot(now) for key, b in sorted(self._by_key.items())}
        return snap
