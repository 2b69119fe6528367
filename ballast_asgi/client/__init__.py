"""The calling end: an httpx transport that carries deadline and tier to the next service.

``httpx.AsyncClient(transport=BallastTransport())`` inside an app protected
by ``install()`` forwards each call's remaining budget (``X-Deadline-Ms``) and
tier (``X-Priority``), refuses calls that cannot make their deadline,
throttles itself per host when the host refuses work (SRE book adaptive
throttling), and retries only idempotent calls after a connect error or a
502/503/504 that is not a ballast shed, within a per-host retry budget.
See docs/chain.md. Imports are lazy (``ballast_asgi.client.core.live`` and the
pure modules load no httpx).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ballast_asgi.core._lazy import lazy_getattr

if TYPE_CHECKING:
    from ballast_asgi.client.core.config import ClientConfig
    from ballast_asgi.client.core.live import client_section
    from ballast_asgi.client.errors import DeadlineExceeded, LocalRefusal, Throttled
    from ballast_asgi.client.metrics import ClientCollector
    from ballast_asgi.client.responses import refusal_handler, refusal_response
    from ballast_asgi.client.transport import BallastTransport

_LAZY = {
    "BallastTransport": "ballast_asgi.client.transport",
    "ClientConfig": "ballast_asgi.client.core.config",
    "ClientCollector": "ballast_asgi.client.metrics",
    "DeadlineExceeded": "ballast_asgi.client.errors",
    "LocalRefusal": "ballast_asgi.client.errors",
    "Throttled": "ballast_asgi.client.errors",
    "client_section": "ballast_asgi.client.core.live",
    "refusal_handler": "ballast_asgi.client.responses",
    "refusal_response": "ballast_asgi.client.responses",
}

__all__ = [
    "BallastTransport",
    "ClientCollector",
    "ClientConfig",
    "DeadlineExceeded",
    "LocalRefusal",
    "Throttled",
    "client_section",
    "refusal_handler",
    "refusal_response",
]

__getattr__ = lazy_getattr("ballast_asgi.client", _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(__all__)
