"""The canary's decision as an operator event (``canary.rolled_back`` / ``canary.promoted``)."""

from __future__ import annotations

from typing import Any

from ballast_asgi.canary.rollout import Rollout, State
from ballast_asgi.events import emit


def announce(rollout: Rollout) -> None:
    """Log the decision of a canary that just left ``running`` (call on that change only)."""
    d = rollout.decision
    if d is None:
        return
    level = "warning" if d.state is State.ROLLED_BACK else "info"
    numbers: dict[str, Any] = {k: v for k, v in d.evidence.items()
                               if isinstance(v, int | float | str) and k != "key"}  # fmt: skip
    emit(f"canary.{d.state.value}", level, reason=d.reason, **numbers)
