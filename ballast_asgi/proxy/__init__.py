"""The terminal proxy: the ASGI app, its transports, header rules and error mapping."""

from __future__ import annotations

from ballast_asgi.proxy.app import ProxyApp

__all__ = ["ProxyApp"]
