"""Routes: the unit of policy. A request is matched to one ``Route`` once, at admission.

A pure core (standard library only). The admission stage asks
``RouteTable.match(method, path, template)`` for every request and puts the
``Route`` it returns on the request context (``ctx.route``); every later
stage reads its policy from there (breaker, retry, rate limit, limiter
partition, default priority and deadline) instead of matching again.

Matching, first hit wins:

1. **Configured routes** (``routes:`` in the config), in file order. A route
   matches when its ``methods`` is empty or holds the request method
   (case-insensitive) and one of its path patterns matches the request path
   with the syntax of the priority rules (``core/classify.py``):
   ``fnmatch.fnmatchcase``, ``*`` matches any run of characters including
   ``/``, ``?`` one character, ``[seq]`` a set; case-sensitive; no query.
2. **The app's route template** (in an app: the template of the framework
   route the request matches, e.g. ``/items/{item_id}``), when a template
   hook is given. Templates come from the app's own route list, so they are
   bounded by it; the table still caps them at ``max_templates``.
3. **An automatic group** (``auto``, on by default): the request's first
   path segment, so ``/status/500`` is route ``/status`` and ``/get`` is route
   ``/get``; ``/`` (and an empty first segment) is route ``/``. Only the
   first ``max_groups`` distinct segments get a group of their own; a
   segment that is not a plain name (``[A-Za-z0-9_.~-]``, at most
   ``MAX_SEGMENT_CHARS``, not all digits: an id is not an endpoint class)
   never does. Everything else is the overflow route ``other``. A client
   inventing paths therefore grows the table (and every per-route breaker,
   metric label and snapshot entry) by at most ``max_groups`` entries, ever.

   With ``learn`` (the default) a segment gets its group only once the
   upstream (or the app) answered one of its requests with a status other
   than 404 (``learn(path, status)``, called by the breaker stage at the
   response head of a request on ``other``): until then its requests are
   route ``other``. Paths the upstream does not know, the ones a client
   invents, so never take a group from a real endpoint. Without ``learn`` a
   segment gets its group at first sight.

With ``auto`` off, an unmatched request is route ``other``.

Route names: configured names are ``[A-Za-z0-9_.-]{1,64}`` and never ``other``;
automatic and template names start with ``/``; so no two kinds can collide.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ballast_asgi.core.priority import Priority

__all__ = [
    "DEFAULT_MAX_GROUPS",
    "OTHER",
    "Route",
    "RouteRule",
    "RouteTable",
    "first_segment_group",
]

#: Automatic groups by default (plus ``/`` and ``other``).
DEFAULT_MAX_GROUPS = 32
#: App route templates kept before the rest go to ``other``.
DEFAULT_MAX_TEMPLATES = 256
#: The overflow route.
OTHER = "other"
#: The longest first segment that may name a group.
MAX_SEGMENT_CHARS = 40
_SEGMENT = re.compile(r"[A-Za-z0-9_.~-]+")
#: Where a route came from (the snapshot's ``source``).
SOURCES = ("config", "app", "auto", "overflow")


@dataclass(frozen=True, slots=True)
class RouteRateLimit:
    """A route's own rate limit (per key value of ``rate_limit.key``)."""

    rate_per_s: float
    burst: int


@dataclass(frozen=True, slots=True, eq=False)
class Route:
    """One route and its resolved policy; immutable, shared by every request it matches.

    ``None`` in a policy field means "the gateway's own setting".
    """

    #: The route's name: the ``route`` label, the ``/snapshot`` key, the breaker key.
    name: str
    #: ``config``, ``app`` (a framework route template), ``auto`` or ``overflow``.
    source: str = "auto"
    #: Default tier for requests of this route that no header, consumer or rule classified.
    priority: Priority | None = None
    #: Default deadline for requests of this route without ``X-Deadline-Ms``.
    deadline_ms: int | None = None
    #: Whether the route gets a limiter partition of its own (``limiter.partition``).
    limiter_partition: bool = False
    #: The route's breaker settings (the gateway's merged with the route's overrides;
    #: the config section, opaque here: the composition builds the breaker from it).
    breaker: Any = None
    #: The route's retry settings (likewise; the retry stage reads them).
    retry: Any = None
    #: The route's own rate limit.
    rate_limit: RouteRateLimit | None = None
    #: The route's path patterns and methods (configured routes; for the snapshot).
    paths: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        """JSON-safe settings for ``/snapshot``."""
        return {
            "source": self.source,
            "paths": list(self.paths),
            "methods": list(self.methods),
            "priority": None if self.priority is None else self.priority.label,
            "deadline_ms": self.deadline_ms,
            "limiter_partition": self.limiter_partition,
            "own_breaker_settings": self.breaker is not None,
            "own_retry_settings": self.retry is not None,
            "rate_limit": None
            if self.rate_limit is None
            else {"rate_per_s": self.rate_limit.rate_per_s, "burst": self.rate_limit.burst},
        }


@dataclass(frozen=True, slots=True)
class RouteRule:
    """A configured route compiled for matching."""

    route: Route
    methods: frozenset[str] | None
    matchers: tuple[Callable[[str], object], ...] = field(default=())

    @classmethod
    def compile(cls, route: Route) -> RouteRule:
        """Compile ``route.paths`` (fnmatch patterns) and ``route.methods``."""
        methods = frozenset(m.strip().upper() for m in route.methods) or None
        matchers = tuple(re.compile(fnmatch.translate(p)).match for p in route.paths)
        return cls(route, methods, matchers)

    def matches(self, method: str, path: str) -> bool:
        """Whether a request with this (upper-case) method and path is this route's."""
        if self.methods is not None and method not in self.methods:
            return False
        return any(m(path) for m in self.matchers)


def _segment(path: str) -> str:
    """The first path segment (``""`` for ``/`` and ``//x``)."""
    if path[:1] == "/":  # ``path[1:].split("/", 1)[0]`` without the copy of the path
        return path.split("/", 2)[1]
    return path.split("/", 1)[0]


def first_segment_group(path: str) -> str | None:
    """The automatic group of ``path``: ``/<first segment>``, ``/`` for the root, None: none."""
    segment = _segment(path)
    if not segment:
        return "/"
    if len(segment) > MAX_SEGMENT_CHARS or segment.isdigit() or not _SEGMENT.fullmatch(segment):
        return None
    return "/" + segment


class RouteTable:
    """Matches requests to routes; the set of routes it can ever return is bounded."""

    def __init__(
        self,
        routes: Iterable[Route] = (),
        *,
        auto: bool = True,
        max_groups: int = DEFAULT_MAX_GROUPS,
        max_templates: int = DEFAULT_MAX_TEMPLATES,
        learn: bool = True,
    ) -> None:
        if max_groups < 0:
            raise ValueError(f"routes max_groups must be >= 0, got {max_groups}")
        configured = tuple(routes)
        names = [r.name for r in configured]
        if len(set(names)) != len(names):
            raise ValueError(f"route names must be unique, got {names}")
        self._rules = tuple(RouteRule.compile(r) for r in configured)
        self.auto = auto
        self.learn_groups = auto and learn
        self.max_groups = max_groups
        self.max_templates = max_templates
        self.other = Route(OTHER, source="overflow")
        self._configured = {r.name: r for r in configured}
        self._groups: dict[str, Route] = {}
        #: The groups by raw first segment (``""`` for ``/``), filled only with valid ones.
        self._by_segment: dict[str, Route] = {}
        self._templates: dict[str, Route] = {}
        #: Requests matched per route name (read by the metrics collector and the snapshot).
        self.counts: dict[str, int] = {}

    @property
    def configured(self) -> Sequence[Route]:
        """The configured routes, in match order."""
        return tuple(rule.route for rule in self._rules)

    @property
    def capacity(self) -> int:
        """The most routes this table can ever hold (the bound on labels and breakers)."""
        return len(self._rules) + self.max_templates + self.max_groups + 2

    def match(self, method: str, path: str, template: str | None = None) -> Route:
        """The route of one request (counted in ``counts``)."""
        route = self._find(method, path, template)
        name = route.name
        counts = self.counts
        counts[name] = counts.get(name, 0) + 1
        return route

    def find(self, method: str, path: str, template: str | None = None) -> Route:
        """The route ``match`` would return, not counted (the shed at the wire counts it
        with ``count`` only when it answers the request itself)."""
        if not self._rules and template is None and self.auto:  # ``_find``'s common case
            found = self._by_segment.get(_segment(path))
            if found is not None:
                return found
        return self._find(method, path, template)

    def count(self, route: Route) -> None:
        """Count one request of ``route`` (what ``match`` does)."""
        name = route.name
        counts = self.counts
        counts[name] = counts.get(name, 0) + 1

    def _find(self, method: str, path: str, template: str | None) -> Route:
        if not self._rules and template is None and self.auto:  # automatic groups only
            found = self._by_segment.get(_segment(path))  # ``_group``, inlined
            if found is not None:
                return found
            return self.other if self.learn_groups else self._add_group(path)
        if self._rules:
            upper = method.upper()
            for rule in self._rules:
                if rule.matches(upper, path):
                    return rule.route
        if template is not None:
            return self._template(template)
        if not self.auto:
            return self.other
        return self._group(path)

    def _template(self, template: str) -> Route:
        found = self._templates.get(template)
        if found is not None:
            return found
        if len(self._templates) >= self.max_templates:
            return self.other
        name = template if template.startswith("/") else "/" + template
        route = self._templates[template] = Route(name, source="app")
        return route

    def _group(self, path: str) -> Route:
        found = self._by_segment.get(_segment(path))
        if found is not None:  # the common case: a segment seen before, no validation again
            return found
        if self.learn_groups:
            return self.other  # until the upstream shows it knows the segment (``learn``)
        return self._add_group(path)

    def learn(self, path: str, status: int) -> None:
        """A request of ``other`` got a response head: a non-404 gives its segment a group."""
        if status != 404 and self.auto:
            self._add_group(path)

    def _add_group(self, path: str) -> Route:
        name = first_segment_group(path)
        if name is None:
            return self.other
        found = self._groups.get(name)
        if found is None:
            if len(self._groups) >= self.max_groups:
                return self.other
            found = self._groups[name] = Route(name, source="auto")
        self._by_segment[name[1:]] = found
        return found

    def known(self) -> dict[str, Route]:
        """Every route this table has returned or may return by configuration, by name."""
        out: dict[str, Route] = dict(self._configured)
        out.update((r.name, r) for r in self._templates.values())
        out.update(self._groups)
        out[OTHER] = self.other
        return out

    def get(self, name: str) -> Route | None:
        """The route called ``name``, if known."""
        return self.known().get(name)
