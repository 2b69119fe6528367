"""One worker's share of the gateway-wide caps (``ballast --workers N``; docs/deploy.md).

Config math only: the config of one of N processes (``scale_config``), and
the live-worker count the supervisor writes when ``workers.redivide_on_loss``
re-divides the caps (``read_live``). The gateway applies them on every
reload; the server (``server/workers.py``, ``server/supervisor.py``) forks
the workers and writes the count.
"""

from __future__ import annotations

import math

from ballast_asgi.config.models import GatewayConfig

__all__ = ["SHARE_FILE", "read_live", "scale_config"]

#: In the supervisor's private directory: how many workers are live, written when
#: one is given up and ``workers.redivide_on_loss`` is on (then SIGUSR1 to each).
SHARE_FILE = "live-workers"

#: (section, key) of every gateway-wide cap divided between workers.
_CAPS = (
    (None, "max_concurrent_requests"),
    ("limiter", "fixed_limit"),
    ("limiter", "initial_limit"),
    ("limiter", "min_limit"),
    ("limiter", "max_limit"),
    ("admission_queue", "max_queue_size"),
    ("capacity", "max_held_requests"),
    ("capacity", "max_buffered_bytes"),
    ("websocket", "max_connections"),
    ("websocket", "max_connections_per_client"),
    ("server", "max_connections"),
    ("proxy", "max_connections"),
)
#: Caps applied only at start-up (a reload refuses or ignores them): always 1/N.
_RESTART_ONLY = frozenset({("server", "max_connections"), ("proxy", "max_connections")})


def scale_config(config: GatewayConfig, workers: int, live: int | None = None) -> GatewayConfig:
    """The config of one of ``workers`` processes: each gateway-wide cap divided, rounded up.

    ``live`` (``workers.redivide_on_loss``, after a worker was given up): the
    reloadable caps are divided by the live workers instead; the start-up-only
    ones (``server``/``proxy`` ``max_connections``) stay divided by ``workers``.
    """
    if workers <= 1:
        return config
    data = config.model_dump()
    for section, key in _CAPS:
        node = data if section is None else data.get(section)
        share = workers if live is None or (section, key) in _RESTART_ONLY else max(1, live)
        if isinstance(node, dict) and isinstance(node.get(key), int):
            node[key] = max(1, math.ceil(node[key] / share))
    return GatewayConfig.model_validate(data)


def read_live(path: str | None) -> int | None:
    """The live-worker count in ``path`` (None: no file, or not a positive integer)."""
    if path is None:
        return None
    try:
        with open(path, encoding="ascii") as f:
            text = f.read(16).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() and len(text) <= 6 and int(text) > 0 else None
