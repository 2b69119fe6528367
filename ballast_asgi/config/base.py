"""What every config section shares: the frozen base model and a few field checks."""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from ballast_asgi.core.redact import redact_userinfo
from ballast_asgi.core.upstream_url import UpstreamURLError, split_upstream_url


class Frozen(BaseModel):
    """A config section: immutable, unknown keys are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def readable(path: str | None, key: str) -> str | None:
    """``path`` when it is None or a readable file; else an error naming ``key``."""
    if path is not None and not os.access(path, os.R_OK):
        raise ValueError(f"{key}: cannot read {path!r}")
    return path


def check_cidrs(v: tuple[str, ...]) -> tuple[str, ...]:
    """``v`` when every entry is an IPv4 or IPv6 network."""
    for cidr in v:
        try:
            ipaddress.ip_network(cidr.strip(), strict=False)
        except ValueError:
            raise ValueError(
                f"invalid CIDR {cidr!r}; expected an IPv4 or IPv6 network such as "
                "10.0.0.0/8 or fd00::/8"
            ) from None
    return v


def check_url(v: str) -> str:
    """An http(s) base URL with a host, without its trailing slash.

    Checked by the same parser the proxy uses at start-up (``split_upstream_url``:
    the port a number in 1..65535, no query or fragment, a usable host), so a
    config that validates also starts (``ballast check-config``).
    """
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL, e.g. http://127.0.0.1:9101")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raw = parts.netloc.rpartition("@")[2].rpartition(":")[2]
        shown = redact_userinfo(v)
        raise ValueError(f"the port must be a number in 1..65535, got {raw!r} in {shown}")
    try:
        split_upstream_url(v)
    except UpstreamURLError as exc:
        raise ValueError(str(exc).removeprefix("upstream: ").removeprefix("upstream ")) from None
    return v.rstrip("/")
