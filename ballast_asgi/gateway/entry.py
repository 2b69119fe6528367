"""The gateway's entry points: ``ballast_asgi.gateway:app`` from the environment, adopted.

``app`` is built on first access from ``BALLAST_*`` (``from_env``); a bad
setting stops the server at start-up with one line naming it. Every access
asks the adopters registered in ``core.adopt`` to adopt the server loading
it (the server package's finds uvicorn's config by the app's name; ADR 0019).
``warn_header_trust`` is the start-up warning while any client may choose its
own tier.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from ballast_asgi.config import GatewayConfig, load_config
from ballast_asgi.core.adopt import adopt
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.redact import redact_userinfo
from ballast_asgi.gateway.root import Gateway, build_gateway
from ballast_asgi.telemetry.events import events

#: The start-up line while any client may choose its own tier.
TRUST_EVENT = "priority.header_trusted_from_anyone"


def warn_header_trust(config: GatewayConfig) -> bool:
    """One start-up warning when ``priority.trust_header`` is true (the default): any
    client can send ``X-Priority: critical``. True when the line was written."""
    if not config.priority.trust_header:
        return False
    return events.emit(
        TRUST_EVENT,
        "warning",
        fix="set priority.trust_header: false and list priority.trusted_networks",
        trusted_networks=len(config.priority.trusted_networks),
    )


def from_env(env: Mapping[str, str] | None = None) -> Gateway:
    """Build the gateway from the environment (``BALLAST_*``)."""
    env = dict(os.environ if env is None else env)
    return build_gateway(load_config(env=env), env=env)


_app: Gateway | None = None


#: The name servers load the standalone gateway by (SPEC).
APP_NAME = "ballast_asgi.gateway:app"


def lazy_app() -> Gateway:
    """``ballast_asgi.gateway.app``: built from the environment on first access.

    Every access asks the registered adopters (``core.adopt``; the server
    package's finds the uvicorn config loading ``APP_NAME``) to adopt the
    server: uvicorn's CLI imports the app once before ``Config.load()`` and
    again inside it (after computing its default headers and protocol class).
    """
    global _app
    if _app is None:
        try:
            _app = from_env()
            warn_header_trust(_app.config)
        except ConfigError as exc:
            print(f"ballast: {redact_userinfo(str(exc))}", file=sys.stderr)
            raise SystemExit(2) from None
    adopt(_app, APP_NAME)
    return _app
