"""A bounded map from rate-limit key to per-key state, least recently used out first.

Memory stays within ``max_keys`` entries however many distinct keys arrive
(keys themselves are capped in length by ``keys.py``). A ``dict`` keeps
insertion order, so re-inserting a key on every access makes the first key
the least recently used one; eviction pops from the front in O(1).

Evicting a key whose bucket is already full again (``tat <= now``) loses
nothing: a fresh entry is identical. Evicting one that still carries debt
forgets that debt (the key gets its burst back early); ``evicted_with_debt``
counts those so an operator can see when ``max_keys`` is too small.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

V = TypeVar("V")


class KeyTable(Generic[V]):
    """LRU-bounded ``key -> V``; ``has_debt(value, now)`` tells what eviction costs."""

    def __init__(self, max_keys: int, has_debt: Callable[[V, float], bool]) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be >= 1, got {max_keys}")
        self.max_keys = max_keys
        self._has_debt = has_debt
        self._data: dict[str, V] = {}
        self.evicted = 0
        self.evicted_with_debt = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def get(self, key: str) -> V | None:
        """The key's state, marked most recently used; None when absent."""
        value = self._data.pop(key, None)
        if value is not None:
            self._data[key] = value
        return value

    def peek(self, key: str) -> V | None:
        """The key's state without touching its recency."""
        return self._data.get(key)

    def put(self, key: str, value: V, now: float) -> None:
        """Store ``value`` as most recently used, evicting the oldest keys when full."""
        data = self._data
        if key in data:
            del data[key]
        else:
            while len(data) >= self.max_keys:
                self._evict_one(now)
        data[key] = value

    def pop(self, key: str) -> V | None:
        """Remove and return the key's state."""
        return self._data.pop(key, None)

    def items(self) -> Iterator[tuple[str, V]]:
        """Every (key, state), least recently used first (a snapshot copy)."""
        return iter(list(self._data.items()))

    def _evict_one(self, now: float) -> None:
        oldest = next(iter(self._data))
        value = self._data.pop(oldest)
        self.evicted += 1
        if self._has_debt(value, now):
            self.evicted_with_debt += 1

    def snapshot(self) -> dict[str, int]:
        """Sizes and eviction counts."""
        return {
            "keys": len(self._data),
            "max_keys": self.max_keys,
            "evicted": self.evicted,
            "evicted_with_debt": self.evicted_with_debt,
        }
