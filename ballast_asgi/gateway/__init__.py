"""The composition: one config in, the whole stack out (gateway, stages, embedding, routes).

``ballast_asgi.gateway:app`` is the standalone gateway, built from the
environment on first access (``BALLAST_*``; see ``root``). ``build_gateway``
builds one from a ``GatewayConfig``; ``install``/``wrap`` (``embed``) put the
same stages in front of an application. ``stack`` turns config into the
stages' collaborators; ``routing`` the route table and its breakers.
"""

from __future__ import annotations

from typing import Any

from ballast_asgi.gateway.entry import TRUST_EVENT, from_env, lazy_app, warn_header_trust
from ballast_asgi.gateway.root import Gateway, build_gateway

__all__ = ["TRUST_EVENT", "Gateway", "build_gateway", "from_env", "warn_header_trust"]


def __getattr__(name: str) -> Any:
    """``app`` is built lazily: importing the package never reads the environment."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return lazy_app()
