"""httpx's own pool as the proxy's transport (``proxy.transport: httpx``), with proxy settings."""

from __future__ import annotations

import ssl

import httpx

from ballast_asgi.proxy.transports.pool_guards import never_reuse_with_leftover_bytes


def upstream_ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """Certificates of https upstreams are always verified: the system's CAs or ``ca_file``."""
    return ssl.create_default_context(cafile=ca_file)


def httpx_transport(
    max_connections: int, idle_s: float, context: ssl.SSLContext | bool = True
) -> httpx.AsyncHTTPTransport:
    """httpx's pool with proxy settings: no environment, no retries, idle expiry ``idle_s``;
    a connection with bytes left after a response is closed, never reused."""
    never_reuse_with_leftover_bytes()
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=idle_s,
    )
    return httpx.AsyncHTTPTransport(limits=limits, trust_env=False, retries=0, verify=context)
