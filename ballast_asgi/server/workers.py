"""``ballast --workers N``: N processes share the listener, and the gateway-wide caps.

Honest about limits: every cap in the config is gateway-wide, and each worker
gets ``ceil(cap / N)`` of it (``scale_config``): concurrency (and the limiter's
initial/min/max), queue size, held requests and buffered bytes, websocket and
server connections, the upstream pool. The adaptive limiters then move within
their share. Nothing else is shared between workers (docs/deploy.md).

The parent binds the traffic and admin sockets, forks the workers (which
inherit the traffic socket and serve it with their own gateway) and serves the
admin port itself, aggregating the workers, each reached on its own Unix
socket: ``/metrics`` sums every sample over the workers (gauges of latency and
state take the maximum), ``/snapshot`` lists each worker's snapshot with its
index and PID, ``/health`` is the worst of theirs. On the traffic port,
``/_ballast/snapshot`` answers from the worker that took the request and says
which one (``worker``). SIGTERM/SIGINT are passed to the workers, which drain.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ballast_asgi.config import GatewayConfig

__all__ = ["SHARE_FILE", "merge_metrics", "read_live", "scale_config"]

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
#: Gauges that do not add up over workers (a latency, a state): the maximum is shown.
_MAX_MARKERS = ("_seconds", "_state")


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


def merge_metrics(texts: Iterable[str]) -> str:
    """Prometheus text of several workers merged into one (summed, or max for latency/state)."""
    families: dict[str, tuple[str, str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            _, _, samples = families.setdefault(
                family.name, (family.type, family.documentation, {})
            )
            use_max = family.type == "gauge" and any(m in family.name for m in _MAX_MARKERS)
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                key = (s.name, tuple(sorted(s.labels.items())))
                old = samples.get(key)
                value = float(s.value)
                samples[key] = (
                    value if old is None else (max(old, value) if use_max else old + value)
                )
    return "".join(_render(name, *body) for name, body in families.items())


def _render(name: str, kind: str, doc: str, samples: dict[Any, float]) -> str:
    lines = [f"# HELP {name} {_escape(doc, help_text=True)}", f"# TYPE {name} {kind}"]
    for (sample, labels), value in samples.items():
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        lines.append(
            f"{sample}{{{inner}}} {_number(value)}" if inner else f"{sample} {_number(value)}"
        )
    return "\n".join(lines) + "\n"


def _escape(value: str, help_text: bool = False) -> str:
    value = value.replace("\\", "\\\\").replace("\n", "\\n")
    return value if help_text else value.replace('"', '\\"')


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)
