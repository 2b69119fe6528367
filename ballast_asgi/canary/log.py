"""The canary's decision as an operator event (``canary.rolled_back`` / ``canary.promoted``)."""

from __future__ import annotations

from typing import Any

from ballast_asgi.canary.core.rollout import Rollout, State
from ballast_asgi.telemetry.events import emit


def announce(rollout: Rollout) -> None:
    """Log the decision of a canary that just left ``running`` (call on that change only)."""
    d = rollout.decision
    if d is None:
        return
    level = "warning" if d.state is State.ROLLED_BACK else "info"
    emit(f"canary.{d.state.value}", level, reason=d.reason, **_numbers(d.evidence))


def _numbers(evidence: dict[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    """The evidence's numbers, nested ones flattened (``errors_log_e_value``), at most 16."""
    out: dict[str, Any] = {}
    for k, v in evidence.items():
        name = f"{prefix}{k}"
        if isinstance(v, bool | int | float) and name != "key":
            out[name] = v
        elif isinstance(v, dict) and depth < 1 and k != "stable_history":
            out.update(_numbers(v, f"{name}_", depth + 1))
    return dict(list(out.items())[:16])
