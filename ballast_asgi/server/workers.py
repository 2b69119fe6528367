"""``ballast --workers N``: N processes share the listener, and the gateway-wide caps.

Honest about limits: every cap in the config is gateway-wide, and each worker
gets ``ceil(cap / N)`` of it (``config/workers.py``, ``scale_config``):
concurrency (and the limiter's initial/min/max), queue size, held requests
and buffered bytes, websocket and server connections, the upstream pool. The
adaptive limiters then move within their share. Nothing else is shared
between workers (docs/deploy.md).

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

from ballast_asgi.config.workers import SHARE_FILE, read_live, scale_config

__all__ = ["SHARE_FILE", "merge_metrics", "read_live", "scale_config"]

#: Gauges that do not add up over workers (a latency, a state): the maximum is shown.
_MAX_MARKERS = ("_seconds", "_state")


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
