"""An upstream URL split and checked once: scheme, wire host, port, path, credentials.

Pure (stdlib only): the config validates ``upstream``, ``canary.upstream``
and pool URLs with it (``ballast check-config``), and the proxy builds its
``Upstream`` value from the same parts (``proxy/upstream.py``, where the
path is encoded the way requests will carry it), so a config that validates
also starts. Messages never show credentials (``redact_url``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ballast_asgi.core.redact import redact_url

#: The schemes an upstream may use and their default ports.
DEFAULT_PORTS = {"http": 80, "https": 443}
#: The longest base path accepted (the URL builder refuses longer components).
MAX_PATH_CHARS = 65_536


class UpstreamURLError(ValueError):
    """An upstream URL that is not ``http(s)://host[:port][/base]``; the message is redacted."""


@dataclass(frozen=True, slots=True)
class UpstreamURL:
    """The parts of a usable upstream URL."""

    scheme: str
    #: Lower-case ASCII (IDNA), IPv6 without brackets: the host as it goes on the wire.
    host: str
    port: int
    #: The base path as written (``""`` when none).
    path: str
    #: ``user[:password]`` when the URL carried them (never shown).
    credentials: str | None = field(default=None, repr=False)


def split_upstream_url(url: str) -> UpstreamURL:
    """Split ``url``; raises ``UpstreamURLError`` (redacted) when it is not usable."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError as exc:  # e.g. a port that is not a number in 0..65535
        raise UpstreamURLError(f"upstream: not a valid URL ({exc}): {shown}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise UpstreamURLError(f"upstream must be an http(s)://host[:port] URL, got {shown}")
    if parts.query or parts.fragment:
        raise UpstreamURLError(f"upstream: no query or fragment allowed, got {shown}")
    if len(parts.path) > MAX_PATH_CHARS or any(c < " " or c == "\x7f" for c in parts.path):
        raise UpstreamURLError(f"upstream: the path is too long or not printable in {shown}")
    return UpstreamURL(
        scheme=scheme,
        host=_wire_host(parts.hostname, shown),
        port=port if port is not None else DEFAULT_PORTS[scheme],
        path=parts.path,
        credentials=parts.netloc.rpartition("@")[0] or None,
    )


def _wire_host(hostname: str, shown: str) -> str:
    try:
        return str(ipaddress.ip_address(hostname))
    except ValueError:
        pass
    try:
        return hostname.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise UpstreamURLError(f"upstream: invalid host name in {shown}") from None
