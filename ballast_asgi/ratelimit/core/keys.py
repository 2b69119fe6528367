"""Which bucket a request spends from: its key value and the limits that apply.

``key`` (config ``rate_limit.key``) names what identifies a caller:

- ``client_ip``: the originating client as the gateway decided it
  (``core/forwarded.py``: the direct peer, or, behind one of
  ``proxy.trusted_proxies``, the right-most untrusted ``X-Forwarded-For`` entry).
- ``consumer``: the value of the API-key header the priority config names
  (``priority.consumers.header``, default ``x-api-key``).
- ``route``: the name of the first ``rate_limit.routes`` rule that matches
  (method and fnmatch path, as the priority rules); unmatched requests share
  the ``default`` route.
- ``header:NAME``: the value of that request header.

A request without the key (no header) spends from one shared ``-`` bucket.
Values longer than ``MAX_KEY_CHARS`` are replaced by a hash, so a hostile
client cannot make a key cost more memory than a short one.

Limits: the matching route's ``rate_per_s``/``burst`` if it sets them, else a
per-key-value override (``rate_limit.overrides``), else the default. The
bucket is ``<route>|<key value>``, so a route with its own limit never shares
a bucket with the default.

A request whose gateway route (``routes[].rate_limit``, matched once at
admission) has a rate limit of its own spends from ``<route name>|<key
value>`` with that route's limits (``resolve_route``), even when the
``rate_limit`` section itself is disabled.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ballast_asgi.core.forwarded import client_ip
from ballast_asgi.ratelimit.core.gcra import Limits

MAX_KEY_CHARS = 128
MISSING = "-"
DEFAULT_ROUTE = "default"


@dataclass(frozen=True, slots=True)
class Route:
    """A named rule: methods (empty: any) and an fnmatch path, with optional own limits."""

    name: str
    path: str = "*"
    methods: tuple[str, ...] = ()
    limits: Limits | None = None


class KeyResolver:
    """Turns an ASGI HTTP scope into ``(bucket key, limits)``."""

    def __init__(
        self,
        key: str,
        default: Limits,
        *,
        routes: Iterable[Route] = (),
        overrides: Mapping[str, Limits] | None = None,
        consumer_header: str = "x-api-key",
    ) -> None:
        self.key = key
        self.default = default
        self.overrides = dict(overrides or {})
        self._routes = [
            (_methods(r), re.compile(fnmatch.translate(r.path)).match, r) for r in routes
        ]
        self._extract = self._extractor(key, consumer_header)
        self._route_limits: dict[str, Limits] = {}

    def _extractor(self, key: str, consumer_header: str) -> Callable[[Mapping[str, Any]], str]:
        if key == "client_ip":
            return lambda scope: client_ip(scope) or MISSING
        if key == "route":
            return lambda scope: MISSING
        if key == "consumer":
            return _header_value(consumer_header)
        if key.startswith("header:") and key[7:].strip():
            return _header_value(key[7:])
        raise ValueError(f"key must be client_ip, consumer, route or header:NAME, got {key!r}")

    def resolve(self, scope: Mapping[str, Any]) -> tuple[str, Limits]:
        """The bucket key and its limits for one request."""
        route = self._route(scope)
        value = _bounded(self._extract(scope))
        limits = route.limits if route and route.limits else self.overrides.get(value, self.default)
        name = route.name if route else DEFAULT_ROUTE
        return f"{name}|{value}", limits

    def resolve_route(
        self, scope: Mapping[str, Any], name: str, rate_per_s: float, burst: int
    ) -> tuple[str, Limits]:
        """The bucket key and limits of a request whose gateway route has its own rate limit."""
        limits = self._route_limits.get(name)
        if limits is None or (limits.rate_per_s, limits.burst) != (rate_per_s, burst):
            limits = self._route_limits[name] = Limits(rate_per_s, burst, name)
        return f"{name}|{_bounded(self._extract(scope))}", limits

    def _route(self, scope: Mapping[str, Any]) -> Route | None:
        if not self._routes:
            return None
        method = str(scope.get("method", "GET")).upper()
        path = str(scope.get("path", "/"))
        for methods, match, route in self._routes:
            if (methods is None or method in methods) and match(path):
                return route
        return None


def _methods(route: Route) -> frozenset[str] | None:
    return frozenset(m.upper() for m in route.methods) or None


def _header_value(name: str) -> Callable[[Mapping[str, Any]], str]:
    wanted = name.strip().lower().encode("latin-1")

    def extract(scope: Mapping[str, Any]) -> str:
        for header, value in scope.get("headers") or ():
            if header == wanted:
                return bytes(value).decode("latin-1").strip() or MISSING
        return MISSING

    return extract


def _bounded(value: str) -> str:
    if len(value) <= MAX_KEY_CHARS and "|" not in value:
        return value
    return "#" + hashlib.blake2b(value.encode("utf-8", "replace"), digest_size=16).hexdigest()
