"""The ``/profile`` wire format: validation (pydantic) and rendering.

``POST /profile`` takes a JSON object with any subset of these fields; the
fields present replace the current values, the others are kept::

    workers             int, 1..10000
    fast, slow          duration: "25ms", "1.5s", "250us", or a number of seconds; <= 10 s
    slow_fraction       float, 0..1
    latency_multiplier  float, > 0 and <= 1000
    error_rate          float, 0..1
    error_status        int, 400..599
    drop_expired        bool
    paths               list of {"prefix": "/slow", "workers": 9, "service": "1s"}
                        (at most 16; prefix starts with "/", <= 64 characters;
                        workers 1..10000; service a duration <= 10 s). The list
                        replaces the current one; [] removes every class.

Unknown fields are rejected (a typo must not pass silently). The 10 s bound on
``fast``/``slow`` also catches ``{"fast": 25}`` meant as milliseconds.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from ballast_tools.units import format_duration, parse_duration_s
from ballast_tools.upstream_sim.model import MAX_PATH_CLASSES, PathClass, Profile, finite_or_none

MAX_SERVICE_S = 10.0


def _service_bound(seconds: float) -> float:
    if seconds > MAX_SERVICE_S:
        raise ValueError(
            f"must be at most {MAX_SERVICE_S:g}s (a bare number means seconds: write e.g. '25ms')"
        )
    return seconds


Duration = Annotated[float, BeforeValidator(parse_duration_s), AfterValidator(_service_bound)]


class PathClassUpdate(BaseModel):
    """One endpoint class of ``paths``."""

    model_config = ConfigDict(extra="forbid", strict=False)

    prefix: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^/[\x21-\x7e]*$")]
    workers: Annotated[int, Field(ge=1, le=10_000)]
    service: Duration


class ProfileUpdate(BaseModel):
    """A partial profile; ``None`` means "keep the current value"."""

    model_config = ConfigDict(extra="forbid", strict=False)

    workers: Annotated[int, Field(ge=1, le=10_000)] | None = None
    fast: Duration | None = None
    slow: Duration | None = None
    slow_fraction: Annotated[float, Field(ge=0, le=1)] | None = None
    latency_multiplier: Annotated[float, Field(gt=0, le=1000)] | None = None
    error_rate: Annotated[float, Field(ge=0, le=1)] | None = None
    error_status: Annotated[int, Field(ge=400, le=599)] | None = None
    drop_expired: bool | None = None
    paths: Annotated[list[PathClassUpdate], Field(max_length=MAX_PATH_CLASSES)] | None = None


_RENAMES = {"fast": "fast_s", "slow": "slow_s"}


def apply_update(profile: Profile, update: ProfileUpdate) -> Profile:
    """``profile`` with the fields present in ``update`` replaced."""
    changes: dict[str, Any] = {
        _RENAMES.get(k, k): v for k, v in update.model_dump(exclude_none=True).items()
    }
    if update.paths is not None:
        changes["paths"] = tuple(PathClass(p.prefix, p.workers, p.service) for p in update.paths)
    return dataclasses.replace(profile, **changes)


def profile_to_dict(profile: Profile) -> dict[str, Any]:
    """The profile as ``GET /profile`` returns it (durations both as text and seconds)."""
    out = dataclasses.asdict(profile)
    out["paths"] = [
        {"prefix": c.prefix, "workers": c.workers, "service": format_duration(c.service_s),
         "service_s": c.service_s,
         "capacity_rps": finite_or_none(c.workers / c.service_s if c.service_s else math.inf)}
        for c in profile.paths
    ]  # fmt: skip
    out.update(
        fast=format_duration(profile.fast_s),
        slow=format_duration(profile.slow_s),
        mean_service_ms=round(profile.mean_service_s * 1e3, 3),
        capacity_rps=finite_or_none(profile.capacity_rps),
    )
    return out
