"""Choose a request's priority tier so that clients cannot promote themselves.

A pure core: it reads the method, path, raw ASGI headers and the peer address
(never a framework object) and everything it needs is precomputed from a frozen
``PriorityConfig`` at construction.

Precedence, first match wins:

1. **Trusted ``X-Priority``.** The header is honoured when ``trust_header`` is
   true (the demo setting) or the direct peer address is inside one of
   ``trusted_networks`` (IPv4 or IPv6 CIDRs; an IPv4-mapped IPv6 peer such as
   ``::ffff:10.1.2.3`` is matched as its IPv4 address). A trusted header wins
   over rules and consumers: it comes from an internal caller (an edge proxy, a
   batch scheduler) that knows better than a static rule. A malformed trusted
   value, or several trusted values that disagree, raise ``HeaderError`` (the
   admission stage answers 400 naming the header); it is never guessed.
2. **Consumer.** The value of the configured API-key header
   (``consumers.header``, default ``x-api-key``) looked up in ``consumers.keys``.
   An unknown key falls through.
3. **Rules**, in file order: a rule matches when its ``methods`` is empty or
   contains the request method (case-insensitive) and its ``path`` pattern
   matches the request path with ``fnmatch.fnmatchcase`` semantics: ``*``
   matches any run of characters *including* ``/`` (so ``/batch/*`` also
   matches ``/batch/a/b``), ``?`` one character, ``[seq]`` a set. The query
   string is not part of the path. Matching is case-sensitive.
4. the matched route's ``priority`` (``routes[].priority``), when it sets one;
5. ``default``.

An ``X-Priority`` header from an untrusted sender is ignored without being
validated (a forged or garbled value must not turn into a 400 an attacker can
provoke at will); ``classify`` reports it so the caller can count
``ballast_priority_header_ignored_total``.

The peer address is ``scope["client"][0]``: the direct TCP peer. Behind a load
balancer that is the balancer's address unless the server rewrites it from
``X-Forwarded-For`` (uvicorn's ``--forwarded-allow-ips``).
"""

from __future__ import annotations

import fnmatch
import functools
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ballast_asgi.core.errors import HeaderError
from ballast_asgi.core.head import RequestHead
from ballast_asgi.core.priority import PRIORITY_HEADER, Priority, parse_priority

if TYPE_CHECKING:
    from ballast_asgi.core.settings import PriorityRuleSettings, PrioritySettings

__all__ = ["Classifier", "parse_networks"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
_Rule = tuple[frozenset[str] | None, Callable[[str], object], Priority]
#: The ``classify`` hook shape of ``AdmissionMiddleware``.

#: Distinct peer addresses whose trust decision is cached.
_TRUST_CACHE_SIZE = 4096


def parse_networks(cidrs: Iterable[str]) -> tuple[IPNetwork, ...]:
    """Parse CIDRs (host bits allowed, a bare address is a /32 or /128)."""
    return tuple(ipaddress.ip_network(c.strip(), strict=False) for c in cidrs)


class Classifier:
    """Map a request to a ``Priority`` according to a ``PriorityConfig``."""

    def __init__(self, config: PrioritySettings) -> None:
        """Precompute networks, consumer keys and compiled rules from ``config``."""
        self.default: Priority = config.default
        self.trust_all: bool = config.trust_header
        self.networks = parse_networks(config.trusted_networks)
        consumers = config.consumers
        self._key_header: bytes = consumers.header.strip().lower().encode("latin-1")
        self._keys: dict[bytes, Priority] = {
            k.encode("utf-8"): p for k, p in consumers.keys.items()
        }
        self._rules: tuple[_Rule, ...] = tuple(_compile_rule(r) for r in config.rules)
        self._peer_trusted = functools.lru_cache(maxsize=_TRUST_CACHE_SIZE)(self._in_networks)

    def classify(
        self,
        method: str,
        path: str,
        headers: Iterable[tuple[bytes, bytes]],
        client_host: str | None,
        default: Priority | None = None,
    ) -> tuple[Priority, bool]:
        """Return ``(tier, header_ignored)``; raise ``HeaderError`` for a bad trusted header.

        ``default``: the tier when nothing else decides (the route's), else ``self.default``.
        """
        raw, key = self._scan(headers)
        return self._decide(method, path, raw, key, client_host, default)

    def classify_head(
        self,
        method: str,
        path: str,
        head: RequestHead,
        client_host: str | None,
        default: Priority | None = None,
    ) -> tuple[Priority, bool]:
        """``classify`` from the head admission read once (``read_head`` with ``key_header``)."""
        if head.priority is None and head.consumer_key is None and not self._rules:
            return (self.default if default is None else default), False  # ``_match_rules``
        raw = None if head.priority is None else [head.priority, *head.more_priorities]
        return self._decide(method, path, raw, head.consumer_key, client_host, default)

    @property
    def key_header(self) -> bytes | None:
        """The consumer-key header ``read_head`` keeps for ``classify_head`` (None: no keys)."""
        return self._key_header if self._keys else None

    def _decide(
        self,
        method: str,
        path: str,
        raw: list[bytes] | None,
        key: bytes | None,
        client_host: str | None,
        default: Priority | None,
    ) -> tuple[Priority, bool]:
        ignored = False
        if raw is not None:
            if self.is_trusted(client_host):
                return _parse_trusted(raw), False
            ignored = True
        if key is not None:
            found = self._keys.get(key)
            if found is not None:
                return found, ignored
        return self._match_rules(method, path, default), ignored

    def classify_scope(
        self, scope: Mapping[str, Any], default: Priority | None = None
    ) -> tuple[Priority, bool]:
        """``classify`` reading method, path, headers and peer from an ASGI HTTP scope."""
        client = scope.get("client")
        host = client[0] if client else None
        return self.classify(scope["method"], scope["path"], scope["headers"], host, default)

    def is_trusted(self, client_host: str | None) -> bool:
        """Whether an ``X-Priority`` header from this peer is honoured."""
        if self.trust_all:
            return True
        if client_host is None or not self.networks:
            return False
        return self._peer_trusted(client_host)

    def _scan(
        self, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[list[bytes] | None, bytes | None]:
        priorities: list[bytes] | None = None
        key: bytes | None = None
        want_key = bool(self._keys)
        for name, value in headers:
            if name == PRIORITY_HEADER:
                if priorities is None:
                    priorities = [value]
                else:
                    priorities.append(value)
            elif want_key and key is None and name == self._key_header:
                key = value
        return priorities, key

    def _fallback(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> Priority:
        if self._keys:
            for name, value in headers:
                if name == self._key_header:
                    found = self._keys.get(value)
                    if found is not None:
                        return found
                    break
        return self._match_rules(method, path)

    def _match_rules(self, method: str, path: str, default: Priority | None = None) -> Priority:
        fallback = self.default if default is None else default
        if not self._rules:
            return fallback
        method = method.upper()
        for methods, match, priority in self._rules:
            if (methods is None or method in methods) and match(path):
                return priority
        return fallback

    def _in_networks(self, host: str) -> bool:
        try:
            addr = ipaddress.ip_address(host.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            mapped = addr.ipv4_mapped
            return any(mapped in net for net in self.networks)
        return any(addr in net for net in self.networks)


def _compile_rule(rule: PriorityRuleSettings) -> _Rule:
    methods = frozenset(m.strip().upper() for m in rule.methods) or None
    regex = re.compile(fnmatch.translate(rule.path))
    return methods, regex.match, rule.priority


def _parse_trusted(values: list[bytes]) -> Priority:
    first = parse_priority(values[0], Priority.STANDARD)
    for other in values[1:]:
        if parse_priority(other, first) is not first:
            raise HeaderError("X-Priority", "appears more than once with different tiers")
    return first
