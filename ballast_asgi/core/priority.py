"""Priority tiers and the pure parser for ``X-Priority``.

Tiers: ``0``/``critical``, ``1``/``standard``, ``2``/``bulk`` (case-insensitive).
A lower number is more important. Anything else is a ``HeaderError``.
"""

from __future__ import annotations

import enum

from ballast_asgi.core.errors import HeaderError

PRIORITY_HEADER = b"x-priority"


class Priority(enum.IntEnum):
    """Request tier; lower values are served first."""

    CRITICAL = 0
    STANDARD = 1
    BULK = 2

    @property
    def label(self) -> str:
        """The lower-case name used in metric labels and JSON."""
        return self.name.lower()


_BY_TOKEN: dict[bytes, Priority] = {}
for _p in Priority:
    _BY_TOKEN[str(_p.value).encode()] = _p
    _BY_TOKEN[_p.name.lower().encode()] = _p

ALL_PRIORITIES: tuple[Priority, ...] = tuple(Priority)


def parse_priority_name(value: str) -> Priority:
    """Parse a tier from config text (same tokens as the header)."""
    found = _BY_TOKEN.get(value.strip().lower().encode())
    if found is None:
        raise ValueError(f"unknown priority {value!r}; allowed: 0/critical, 1/standard, 2/bulk")
    return found


def parse_priority(raw: bytes | None, default: Priority) -> Priority:
    """Parse a raw ``X-Priority`` value; ``None`` (absent) gives ``default``."""
    if raw is None:
        return default
    found = _BY_TOKEN.get(raw.strip().lower())
    if found is None:
        raise HeaderError(
            "X-Priority",
            "must be one of 0/critical, 1/standard, 2/bulk (case-insensitive)",
        )
    return found
