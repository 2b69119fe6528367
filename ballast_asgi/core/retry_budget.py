"""Retry budget: retries are a bounded share of original requests (pure).

A retry is allowed only while the retries granted in the trailing window stay
within an allowance proportional to the original requests in that window::

    allowance(now) = budget_ratio * originals_in_window(now) + floor
    floor          = min_retries_per_s * window_s
    grant a retry  iff  retries_in_window(now) + 1 <= allowance(now)

Defaults: ``budget_ratio = 0.1`` (at most 10% extra load), ``window_ms =
10_000``, ``min_retries_per_s = 1.0`` (so ``floor = 10`` retries per window:
a quiet service can still retry at all). As failures rise, originals stay
flat, so the allowance stays flat: retry load is bounded exactly when it would
otherwise compound. ``balance(now) = max(0, allowance - retries_in_window)``.

The window is kept in ``buckets`` (default 10) ring slots of ``window_s /
buckets`` seconds each, so memory is bounded: counting an original (once per
proxied request) is O(1) within a bucket, a retry's check O(buckets).
"In the window" means "in the current bucket or the ``buckets - 1`` before
it": a span of between ``window_s - bucket_s`` and ``window_s`` seconds.
Hence the exact guarantee, checked by the property tests: whenever a retry is
granted at ``t``,

    retries granted in (t - window_s + bucket_s, t]
        <= budget_ratio * originals in (t - window_s, t] + floor

and over any interval of length ``L`` the retries are at most
``budget_ratio * originals(in the interval and the window before it) +
floor * (floor(L / (window_s - bucket_s)) + 1)``. No online budget can do
better than "originals recently seen": a retry cannot be revoked when the
original that paid for it leaves the window.

Reference: Finagle's ``RetryBudget`` and Envoy's ``RetryBudget``
(``budget_percent``, ``min_retry_concurrency``), on a time window.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ballast_asgi.core.settings import RetryBudgetSettings

DEFAULT_BUCKETS = 10
#: Defaults (``RetryConfig`` references them; see the module docstring).
DEFAULT_BUDGET_RATIO = 0.1
DEFAULT_WINDOW_MS = 10_000
DEFAULT_MIN_RETRIES_PER_S = 1.0
_NEVER = -(2**62)


class WindowCounts:
    """Counts of a few event kinds over a trailing time window, in ring buckets.

    ``add(now, kind)`` is O(1) while ``now`` falls in the newest bucket already
    started (almost every call: a bucket is ``window_s / buckets`` long) and
    O(kinds) when it starts one; ``total(now, kind)`` is O(buckets). Time never
    runs backwards here: an older ``now`` is treated as the newest time seen.
    """

    __slots__ = (
        "_epochs", "_hot", "_hot_slot", "_latest", "_n", "_per_s", "_values", "bucket_s",
        "window_s",
    )  # fmt: skip

    def __init__(self, window_s: float, *, buckets: int = DEFAULT_BUCKETS, kinds: int = 2) -> None:
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        if not 1 <= buckets <= 1_000:
            raise ValueError(f"buckets must be in 1..1000, got {buckets}")
        self.window_s = window_s
        self.bucket_s = window_s / buckets
        self._per_s = buckets / window_s
        self._n = buckets
        self._latest = _NEVER
        #: ``_latest + 1`` once the newest bucket's slot is started (reset), else ``_NEVER``:
        #: ``now * _per_s < _hot`` means ``now`` counts in slot ``_hot_slot``.
        self._hot = _NEVER
        self._hot_slot = 0
        self._epochs = [_NEVER] * buckets
        self._values = [[0] * buckets for _ in range(kinds)]

    def _epoch(self, now: float) -> int:
        epoch = math.floor(now * self._per_s)
        if epoch > self._latest:
            self._latest = epoch
            self._hot = _NEVER  # a newer bucket: its slot is not started yet
            return epoch
        return self._latest

    def add(self, now: float, kind: int, n: int = 1) -> None:
        """Count ``n`` events of ``kind`` at ``now``."""
        if now * self._per_s < self._hot:  # in the newest bucket, already started
            self._values[kind][self._hot_slot] += n
            return
        epoch = self._epoch(now)
        slot = epoch % self._n
        if self._epochs[slot] != epoch:
            self._epochs[slot] = epoch
            for values in self._values:
                values[slot] = 0
        self._hot = epoch + 1
        self._hot_slot = slot
        self._values[kind][slot] += n

    def total(self, now: float, kind: int) -> int:
        """Events of ``kind`` in the current bucket and the ``buckets - 1`` before it."""
        epoch = self._epoch(now)
        oldest = epoch - self._n + 1
        values = self._values[kind]
        return sum(values[i] for i, e in enumerate(self._epochs) if e >= oldest)

    def remove(self, at: float, kind: int) -> bool:
        """Take back one event of ``kind`` counted at ``at``, if its bucket is still kept;
        False (nothing changed) once that bucket has left the window or holds none."""
        epoch = math.floor(at * self._per_s)
        slot = epoch % self._n
        values = self._values[kind]
        if self._epochs[slot] != epoch or values[slot] <= 0:
            return False
        values[slot] -= 1
        return True

    def clear(self) -> None:
        """Forget every event."""
        self._epochs = [_NEVER] * self._n
        self._hot = _NEVER
        for values in self._values:
            values[:] = [0] * self._n


_ORIGINAL = 0
_RETRY = 1


class RetryBudget:
    """A shared allowance of retries: ``budget_ratio`` of originals plus a floor."""

    def __init__(
        self,
        *,
        budget_ratio: float = DEFAULT_BUDGET_RATIO,
        window_ms: int = DEFAULT_WINDOW_MS,
        min_retries_per_s: float = DEFAULT_MIN_RETRIES_PER_S,
        buckets: int = DEFAULT_BUCKETS,
    ) -> None:
        if not 0.0 <= budget_ratio <= 1.0:
            raise ValueError(f"budget_ratio must be in [0, 1], got {budget_ratio}")
        if not window_ms >= 1:
            raise ValueError(f"window_ms must be >= 1, got {window_ms}")
        if not min_retries_per_s >= 0.0:
            raise ValueError(f"min_retries_per_s must be >= 0, got {min_retries_per_s}")
        self.budget_ratio = budget_ratio
        self.window_s = window_ms / 1000.0
        self.min_retries_per_s = min_retries_per_s
        #: Retries always allowed per window, whatever the traffic.
        self.floor = min_retries_per_s * self.window_s
        self._window = WindowCounts(self.window_s, buckets=buckets, kinds=2)
        self._originals_total = 0
        self._granted_total = 0
        self._denied_total = 0
        self._refunded_total = 0

    @classmethod
    def from_config(cls, config: RetryBudgetSettings) -> RetryBudget:
        """Build from the ``retry`` section of the gateway config."""
        return cls(
            budget_ratio=config.budget_ratio,
            window_ms=config.window_ms,
            min_retries_per_s=config.min_retries_per_s,
        )

    def record_original(self, now: float) -> None:
        """Count one original (first-attempt) request."""
        self._originals_total += 1
        window = self._window
        if now * window._per_s < window._hot:  # ``add``'s shortcut, inlined (once per request)
            window._values[_ORIGINAL][window._hot_slot] += 1
        else:
            window.add(now, _ORIGINAL)

    def allowance(self, now: float) -> float:
        """Retries the window allows in total: ratio * originals + floor."""
        return self.budget_ratio * self._window.total(now, _ORIGINAL) + self.floor

    def try_acquire_retry(self, now: float) -> bool:
        """Take one retry from the budget; False (and nothing taken) when empty."""
        if self._window.total(now, _RETRY) + 1 <= self.allowance(now):
            self._window.add(now, _RETRY)
            self._granted_total += 1
            return True
        self._denied_total += 1
        return False

    def refund_retry(self, granted_at: float) -> bool:
        """Give back a retry granted at ``granted_at`` that never ran (the client left, the
        breaker shut during the backoff, the held answer went out after all): only retries
        sent count against the allowance, as in Envoy's budget of active retries. False
        when its bucket has already left the window (it no longer counts anyway)."""
        if not self._window.remove(granted_at, _RETRY):
            return False
        self._refunded_total += 1
        return True

    def balance(self, now: float) -> float:
        """Retries still available in the window right now (>= 0)."""
        return max(0.0, self.allowance(now) - self._window.total(now, _RETRY))

    def snapshot(self, now: float) -> dict[str, Any]:
        """JSON-safe state for ``/snapshot``."""
        return {
            "balance": round(self.balance(now), 3),
            "originals_in_window": self._window.total(now, _ORIGINAL),
            "retries_in_window": self._window.total(now, _RETRY),
            "originals_total": self._originals_total,
            "retries_granted_total": self._granted_total,
            "retries_denied_total": self._denied_total,
            "retries_refunded_total": self._refunded_total,
            "budget_ratio": self.budget_ratio,
            "window_s": self.window_s,
            "floor": self.floor,
        }
