"""How much evidence one client may give the canary judge: a per-client cap per window.

The judge compares which version a window's errors came from. A client that
could reach one version on purpose (a sticky key it found online, behaviour
that tells the versions apart) could sink a good canary with failing
requests, or mask a bad one by flooding it with successes (issue 27). Not
steering is the split's job (``split.py``); this bounds what is left: in each
window (the judge's current block, 1 s; the caller names it by its start) at
most ``per_window`` outcomes of one client are counted, whichever version
served them and whatever they were; the rest are served but not judged. The
choice depends on arrival order only, never on the version or the outcome,
so under "no difference" the kept outcomes are still a fair sample and the
judge's guarantee is unchanged.

The table is bounded: at most ``max_clients`` clients per window; later
clients in that window share one overflow entry (and its cap), so many
addresses cannot grow memory either. The key is the resolved client address
(``proxy.trusted_proxies`` decides it); a request without one is one client.
Pure: time is an argument.
"""

from __future__ import annotations

import math

#: The key of a request without a client address, and of the overflow entry.
_ANONYMOUS = ""
_OVERFLOW = "\x00overflow"


class ClientBudget:
    """Admit at most ``per_window`` judged outcomes per client in each window."""

    __slots__ = ("_counts", "_window", "dropped", "max_clients", "per_window")

    def __init__(self, per_window: int, *, max_clients: int = 10_000) -> None:
        if per_window < 1 or max_clients < 1:
            raise ValueError(
                f"per_window and max_clients must be >= 1, got {per_window}, {max_clients}"
            )
        self.per_window = per_window
        self.max_clients = max_clients
        self._counts: dict[str, int] = {}
        self._window = -math.inf
        #: Outcomes not judged because their client had used its share (since start).
        self.dropped = 0

    def admit(self, client: str | None, window: float) -> bool:
        """Whether this outcome of ``client`` may count in ``window`` (the block's start)."""
        if window != self._window:
            self._window = window
            self._counts.clear()
        key = client or _ANONYMOUS
        counts = self._counts
        used = counts.get(key)
        if used is None:
            if len(counts) >= self.max_clients:
                key = _OVERFLOW
                used = counts.get(key, 0)
            else:
                used = 0
        if used >= self.per_window:
            self.dropped += 1
            return False
        counts[key] = used + 1
        return True

    def __len__(self) -> int:
        return len(self._counts)


__all__ = ["ClientBudget"]
