"""Which forwarded headers to believe: ``X-Forwarded-For`` / ``-Proto`` from trusted proxies only.

A pure core (standard library only). The gateway never lets a client-supplied
header change ``scope["client"]``: that stays the direct TCP peer, which is
what ``priority.trusted_networks`` is checked against and what the proxy
appends to ``X-Forwarded-For``. The *originating* client address (for logs
and per-client keys) is derived here:

* the direct peer is not in ``proxy.trusted_proxies`` (the default: the list
  is empty): the originating client **is** the peer; forwarded headers are
  passed on but believed for nothing;
* the peer is a trusted proxy: walk ``X-Forwarded-For`` from the right
  (each proxy appends the address it saw), skipping trusted proxies; the first
  untrusted entry is the client. When every entry is trusted the leftmost one
  is. ``X-Forwarded-Proto`` (``http``/``https``) from a trusted proxy becomes
  the scheme.

``rewritten_by_server`` recognises a scope whose ``client`` was already
rewritten from ``X-Forwarded-For`` by the server (uvicorn's proxy-headers
middleware): its client address is one of the header's entries. The gateway
then no longer knows the direct peer and treats it as unknown (never trusted).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "CLIENT_IP_KEY",
    "ForwardedTrust",
    "client_ip",
    "forwarded_entries",
    "rewritten_by_server",
]

_XFF = b"x-forwarded-for"
_XFP = b"x-forwarded-proto"
#: Longest header value inspected (a forged 1 MB value costs nothing to ignore).
_MAX_VALUE = 8192
_SCHEMES = frozenset({"http", "https"})


def forwarded_entries(headers: Iterable[tuple[bytes, bytes]]) -> list[str]:
    """Every ``X-Forwarded-For`` entry, left to right, over repeated headers."""
    out: list[str] = []
    for name, value in headers:
        if name == _XFF:
            text = value[:_MAX_VALUE].decode("latin-1")
            out.extend(item.strip() for item in text.split(",") if item.strip())
    return out


def _host_of(entry: str) -> str:
    """The address part of ``1.2.3.4``, ``1.2.3.4:80``, ``[::1]:80`` or ``::1``."""
    if entry.startswith("["):
        return entry[1 : entry.find("]")] if "]" in entry else entry
    if entry.count(":") == 1:
        return entry.split(":", 1)[0]
    return entry


def rewritten_by_server(client: Sequence[object] | None, entries: Sequence[str]) -> bool:
    """True when ``client`` looks taken from ``X-Forwarded-For`` rather than the socket."""
    if not client or not entries:
        return False
    host = str(client[0])
    return any(_host_of(e) == host for e in entries)


class ForwardedTrust:
    """Decide the originating client and scheme from the peer and forwarded headers."""

    def __init__(self, trusted_proxies: Iterable[str] = ()) -> None:
        self.networks = tuple(
            ipaddress.ip_network(c.strip(), strict=False) for c in trusted_proxies
        )

    @property
    def enabled(self) -> bool:
        """Whether any proxy is trusted at all."""
        return bool(self.networks)

    def is_trusted(self, host: str | None) -> bool:
        """Whether ``host`` is a trusted proxy (an unparsable host never is)."""
        if not host or not self.networks:
            return False
        try:
            ip = ipaddress.ip_address(_host_of(host))
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self.networks)

    def client_ip(self, peer: str | None, entries: Sequence[str]) -> str | None:
        """The originating client: the peer unless it is a trusted proxy."""
        if not self.is_trusted(peer) or not entries:
            return peer
        for entry in reversed(entries):
            if not self.is_trusted(entry):
                return _host_of(entry)
        return _host_of(entries[0])

    def scheme(self, peer: str | None, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """``X-Forwarded-Proto`` when the peer is a trusted proxy and the value is sane."""
        if not self.is_trusted(peer):
            return None
        for name, value in headers:
            if name == _XFP:
                text = value[:16].decode("latin-1").strip().lower()
                return text if text in _SCHEMES else None
        return None


#: Scope key holding the originating client address decided by ``ForwardedTrust``
#: (present only when the direct peer is a trusted proxy).
CLIENT_IP_KEY = "ballast.client_ip"


def client_ip(scope: Mapping[str, Any]) -> str | None:
    """The originating client of a request: the trusted-proxy answer, else the direct peer."""
    found = scope.get(CLIENT_IP_KEY)
    if found is not None:
        return str(found)
    client = scope.get("client")
    return str(client[0]) if client else None
