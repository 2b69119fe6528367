"""The proxy's upstream clients behind one factory, ``make_transport(config.proxy)``.

``lean`` (the default: aiohttp's pool with a lean direct path), ``aiohttp``
and ``httpx``; each is an ``httpx.AsyncBaseTransport``. ``direct`` holds the
response value the lean and aiohttp direct paths return. The modules import
one another only downwards (direct <- aiohttp_adapt <- aiohttp <- lean;
lean_conn <- lean_wire <- lean); only this factory knows all of them.
"""

from __future__ import annotations

from typing import Any

import httpx

from ballast_asgi.config import ProxyConfig
from ballast_asgi.proxy.transports.aiohttp_transport import AiohttpTransport
from ballast_asgi.proxy.transports.direct import DirectResponse, ResponseBody
from ballast_asgi.proxy.transports.httpx_transport import httpx_transport, upstream_ssl_context
from ballast_asgi.proxy.transports.lean import LeanTransport

__all__ = [
    "AiohttpTransport",
    "DirectResponse",
    "LeanTransport",
    "ResponseBody",
    "httpx_transport",
    "make_transport",
    "upstream_ssl_context",
]


def make_transport(config: ProxyConfig) -> httpx.AsyncBaseTransport:
    """The proxy's transport chosen by ``config.transport`` ("lean", "aiohttp" or "httpx")."""
    idle_s = config.pool_idle_timeout_ms / 1000.0
    context = upstream_ssl_context(config.ca_file)
    settings: dict[str, Any] = {
        "max_connections": config.max_connections,
        "keepalive_s": idle_s,
        "max_headers": config.max_response_headers,
        "ssl_context": context,
    }
    if config.transport == "lean":
        return LeanTransport(**settings)
    if config.transport == "aiohttp":
        return AiohttpTransport(**settings)
    return httpx_transport(config.max_connections, idle_s, context)
