"""The ``routes`` list and ``auto_routes``: routes are the unit of policy (docs/routes.md).

A route names a set of requests (method and fnmatch path patterns, the syntax
of the priority rules) and may set, for them only: a default priority, a
default deadline, breaker and retry overrides (any key of the ``breaker`` /
``retry`` sections; the rest is inherited from the gateway's), a rate limit,
and a limiter partition of its own. Matching and the automatic grouping of
everything else live in the pure core ``core/routes.py``.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Optional, cast

from pydantic import BaseModel, Field, ValidationError, create_model, field_validator
from pydantic.fields import FieldInfo

from ballast_asgi.config.base import Frozen
from ballast_asgi.config.policy import BreakerConfig, RetryConfig
from ballast_asgi.core.priority import Priority, parse_priority_name
from ballast_asgi.core.routes import DEFAULT_MAX_GROUPS, OTHER

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_METHOD = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}")
#: Most configured routes (each is a breaker, a metric label and a snapshot entry).
MAX_ROUTES = 256


def _partial(model: type[BaseModel], exclude: tuple[str, ...] = ()) -> Any:
    """``model`` with every field optional (None: inherit), same ranges, unknown keys errors."""
    fields: dict[str, Any] = {
        name: (Optional[f.annotation], FieldInfo.merge_field_infos(f, default=None))  # noqa: UP045
        for name, f in model.model_fields.items()
        if name not in exclude
    }
    return create_model(f"Route{model.__name__}", __base__=Frozen, **fields)


#: A route's breaker overrides (``scope`` is the gateway's choice, not a route's).
RouteBreakerOverrides: Any = _partial(BreakerConfig, exclude=("scope",))
#: A route's retry overrides.
RouteRetryOverrides: Any = _partial(RetryConfig)


class RouteRateLimitConfig(Frozen):
    """A route's own rate limit, per value of ``rate_limit.key`` (default: client address)."""

    rate_per_s: float = Field(gt=0, le=10_000_000)
    burst: int = Field(100, ge=1, le=10_000_000)


class RouteLimiterConfig(Frozen):
    """A route's limiter settings."""

    #: Give the route a limiter partition of its own (read by the limiter stage).
    partition: bool = False


class RouteConfig(Frozen):
    """One route: what it matches and the policy it sets (None: the gateway's)."""

    name: str
    #: fnmatch pattern(s), as the priority rules: ``/api/*``, or a list of them.
    path: tuple[str, ...] = ("*",)
    #: Methods (empty: any).
    methods: tuple[str, ...] = ()
    priority: Priority | None = None
    deadline_ms: int | None = Field(None, ge=1, le=86_400_000)
    #: Breaker overrides: any ``breaker`` key but ``scope`` (the rest is the gateway's).
    breaker: dict[str, Any] | None = None
    #: Retry overrides: any ``retry`` key (the rest is the gateway's).
    retry: dict[str, Any] | None = None
    rate_limit: RouteRateLimitConfig | None = None
    limiter: RouteLimiterConfig = RouteLimiterConfig()

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v) or v == OTHER:
            raise ValueError(
                f"must be 1-64 characters from A-Z a-z 0-9 _ . - and not {OTHER!r} (the overflow "
                f"route), got {v!r}"
            )
        return v

    @field_validator("path", mode="before")
    @classmethod
    def _paths(cls, v: Any) -> Any:
        paths = (v,) if isinstance(v, str) else v
        if isinstance(paths, list | tuple):
            if not 1 <= len(paths) <= 64:
                raise ValueError(f"must list 1..64 path patterns, got {len(paths)}")
            for p in paths:
                if not isinstance(p, str) or not 1 <= len(p) <= 1024:
                    raise ValueError(f"a path pattern is a string of 1..1024 characters, got {p!r}")
                fnmatch.translate(p)
            return tuple(paths)
        return v

    @field_validator("methods")
    @classmethod
    def _methods(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        bad = [m for m in v if not _METHOD.fullmatch(m)]
        if bad:
            raise ValueError(f"methods must be HTTP method tokens such as GET, got {bad}")
        return tuple(m.upper() for m in v)

    @field_validator("breaker", mode="before")
    @classmethod
    def _breaker(cls, v: Any) -> Any:
        return _overrides(RouteBreakerOverrides, v)

    @field_validator("retry", mode="before")
    @classmethod
    def _retry(cls, v: Any) -> Any:
        return _overrides(RouteRetryOverrides, v)

    @field_validator("priority", mode="before")
    @classmethod
    def _tier(cls, v: Any) -> Any:
        if v is None or isinstance(v, Priority):
            return v
        return parse_priority_name(str(v))

    def breaker_config(self, base: BreakerConfig) -> BreakerConfig | None:
        """The gateway's breaker settings with this route's overrides (None: no overrides)."""
        merged = _merge(base, self.breaker, f"routes[{self.name}].breaker")
        return cast("BreakerConfig | None", merged)

    def retry_config(self, base: RetryConfig) -> RetryConfig | None:
        """The gateway's retry settings with this route's overrides (None: no overrides)."""
        return cast("RetryConfig | None", _merge(base, self.retry, f"routes[{self.name}].retry"))


class AutoRoutesConfig(Frozen):
    """Requests no configured route matches, grouped by first path segment (bounded)."""

    enabled: bool = True
    #: Distinct first segments that get a route of their own; the rest share ``other``.
    max_groups: int = Field(DEFAULT_MAX_GROUPS, ge=0, le=1_000)
    #: A segment gets its route once the upstream answered one of its requests with a
    #: status other than 404 (paths it does not know never take a group); false: at once.
    learn: bool = True


def _overrides(model: Any, v: Any) -> Any:
    """``v`` checked against ``model`` (keys and ranges), as a plain dict without nulls."""
    if v is None or not isinstance(v, dict):
        return v
    try:
        checked = model.model_validate(v)
    except ValidationError as exc:
        raise ValueError(_first_error(exc)) from None
    return checked.model_dump(exclude_none=True)


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(x) for x in first["loc"])
    msg = "unknown key" if first["type"] == "extra_forbidden" else str(first["msg"])
    msg = msg.removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def _merge(base: Any, overrides: dict[str, Any] | None, where: str) -> Any:
    if overrides is None:
        return None
    try:
        return type(base).model_validate({**base.model_dump(), **overrides})
    except ValidationError as exc:
        raise ValueError(f"{where}: {_first_error(exc)}") from None


def check_routes(
    routes: tuple[RouteConfig, ...], breaker: BreakerConfig, retry: RetryConfig
) -> None:
    """Raise ``ValueError`` for duplicate names, too many routes, or overrides that do not merge."""
    if len(routes) > MAX_ROUTES:
        raise ValueError(f"routes: at most {MAX_ROUTES} routes, got {len(routes)}")
    names = [r.name for r in routes]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"routes: names must be unique, got {dupes} more than once")
    for r in routes:
        r.breaker_config(breaker)
        r.retry_config(retry)
