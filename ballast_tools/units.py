"""Duration parsing shared by the instruments (pure).

Durations are written with a unit, Go style: ``"250us"``, ``"25ms"``, ``"1.5s"``,
``"2m"``. A bare number (a JSON number, or a string without a unit) means
**seconds**, following the project rule that float time parameters are in
seconds. Every function returns seconds as a float.
"""

from __future__ import annotations

import math
import re

_UNITS_S = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(us|µs|ms|s|m)?\s*$")


def parse_duration_s(value: str | float | int) -> float:
    """Parse ``"25ms"``, ``"1.5s"``, ``"250us"``, ``"2m"`` or a number of seconds."""
    if isinstance(value, bool):
        raise ValueError("a duration must be a number of seconds or a string like '25ms'")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION_RE.match(value)
        if match is None:
            raise ValueError(f"invalid duration {value!r}: write e.g. '25ms', '1.5s' or '250us'")
        seconds = float(match.group(1)) * _UNITS_S[match.group(2) or "s"]
    else:
        raise ValueError("a duration must be a number of seconds or a string like '25ms'")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"invalid duration {value!r}: must be finite and >= 0")
    return seconds


def format_duration(seconds: float) -> str:
    """Render seconds the way ``parse_duration_s`` reads them back (``"25ms"``)."""
    if seconds >= 1.0:
        return f"{seconds:g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:g}ms"
    return f"{seconds * 1e6:g}us"
