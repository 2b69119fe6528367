"""The fixed limit: the baseline every adaptive algorithm is measured against.

``limit`` never changes with samples. ``set_limit`` makes it a settable fake
for tests and for operators who want to move it by hand.
"""

from __future__ import annotations

from ballast_asgi.core.limit.base import Sample


class FixedLimit:
    """A constant concurrency limit."""

    name = "fixed"

    def __init__(self, limit: int = 16) -> None:
        if limit < 1:
            raise ValueError(f"fixed limit must be >= 1, got {limit}")
        self._limit = limit

    @property
    def limit(self) -> int:
        """The constant limit."""
        return self._limit

    def set_limit(self, limit: int) -> None:
        """Change the limit (tests, manual operation)."""
        if limit < 1:
            raise ValueError(f"fixed limit must be >= 1, got {limit}")
        self._limit = limit

    def on_sample(self, sample: Sample, now: float) -> int:
        """Ignore the sample."""
        return self._limit

    def snapshot(self) -> dict[str, object]:
        """The constant."""
        return {"name": self.name, "limit": self._limit}
