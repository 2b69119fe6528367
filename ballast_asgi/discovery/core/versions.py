"""From registrations to config versions: when to write version N+1 (pure).

The controller feeds every change under the service's instance prefix into a
``VersionPlanner`` (``put`` / ``delete``, or ``relist`` after a lost watch)
and asks ``take(now)`` when a write is due. The planner answers with the
instance list to write, or ``None``.

The rules:

* **Debounce.** A change schedules a write ``debounce_s`` later (default
  50 ms); further changes push it back, but never past ``max_wait_s`` (500 ms)
  after the first unwritten change, so steady churn still converges.
* **Only real changes.** A put of the value a key already has changes
  nothing. The driver writes version N+1 only when the list differs from
  version N (``differs``), so a burst that ends where it started writes nothing.
* **Leaving vs vanishing.** A registrar that leaves on purpose first writes
  ``leaving: true``: the instance goes at once (after the debounce). A key that
  simply disappears (its lease expired: a crash, or a lease lost in a blip)
  stays in the list for ``removal_grace_s`` (default 2 s); if the same key
  comes back with the same value in that time (the registrar re-registered
  after a lost lease), nothing changed and no version is written. A crashed
  instance leaves the list ``ttl + removal_grace_s`` after its last keep-alive;
  until then the gateways' retries and the pool's ejection cover it.
* ``seed(current, now)`` starts a new controller from the current version:
  instances listed there but not registered get the same grace, so a
  controller that takes over during a lease loss does not remove them.

Times are monotonic seconds passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping

from ballast_asgi.discovery.core.model import Instance, Registration

Key = bytes


class VersionPlanner:
    """Tracks the registered instances and decides when a new version is due."""

    def __init__(
        self, *, debounce_s: float = 0.05, max_wait_s: float = 0.5, removal_grace_s: float = 2.0
    ) -> None:
        if debounce_s < 0 or max_wait_s < debounce_s or removal_grace_s < 0:
            raise ValueError("need 0 <= debounce_s <= max_wait_s and removal_grace_s >= 0")
        self.debounce_s = debounce_s
        self.max_wait_s = max_wait_s
        self.removal_grace_s = removal_grace_s
        self._live: dict[Key, Instance] = {}
        self._expiring: dict[Key, tuple[Instance, float]] = {}
        self._due: float | None = None
        self._first: float | None = None

    # -- events -----------------------------------------------------------------
    def put(self, key: Key, registration: Registration, now: float) -> None:
        """A key was written."""
        if registration.leaving:
            self._drop(key, now)
            return
        instance = registration.instance
        before = self._live.get(key) or self._expiring.get(key, (None, 0.0))[0]
        self._expiring.pop(key, None)
        self._live[key] = instance
        if before != instance:
            self._touch(now)

    def delete(self, key: Key, now: float) -> None:
        """A key disappeared (deleted, or its lease expired)."""
        instance = self._live.pop(key, None)
        if instance is None:
            return
        if self.removal_grace_s == 0:
            self._touch(now)
        else:
            self._expiring[key] = (instance, now + self.removal_grace_s)

    def relist(self, registrations: Mapping[Key, Registration], now: float) -> None:
        """A full listing (after a lost watch): keys not in it vanished, the rest were put."""
        for key in [k for k in self._live if k not in registrations]:
            self.delete(key, now)
        for key, registration in registrations.items():
            self.put(key, registration, now)

    def seed(self, current: Mapping[Key, Instance], now: float) -> None:
        """Start from the current version: listed but unregistered instances get the grace."""
        for key, instance in current.items():
            if key not in self._live and key not in self._expiring:
                self._expiring[key] = (instance, now + self.removal_grace_s)
        self._touch(now)

    # -- decisions --------------------------------------------------------------
    def take(self, now: float) -> tuple[Instance, ...] | None:
        """The list to write as the next version if a write is due now, else ``None``."""
        self._expire(now)
        if self._due is None or now < self._due:
            return None
        self._due = self._first = None
        return self.desired()

    def retry(self, now: float) -> None:
        """A write failed (etcd unreachable, lost compare-and-swap): try again soon."""
        self._touch(now)

    def desired(self) -> tuple[Instance, ...]:
        """The instance list as it stands: live plus those still in their grace."""
        listed = set(self._live.values())
        listed.update(instance for instance, _ in self._expiring.values())
        return tuple(sorted(listed))

    def wake_at(self) -> float | None:
        """When ``take`` may next return something (``None``: only after an event)."""
        times = [due for _, due in self._expiring.values()]
        if self._due is not None:
            times.append(self._due)
        return min(times, default=None)

    @property
    def live_count(self) -> int:
        """Instances registered right now (not counting those in their grace)."""
        return len(self._live)

    # -- internals --------------------------------------------------------------
    def _drop(self, key: Key, now: float) -> None:
        gone = self._live.pop(key, None) or self._expiring.pop(key, (None, 0.0))[0]
        self._expiring.pop(key, None)
        if gone is not None:
            self._touch(now)

    def _expire(self, now: float) -> None:
        for key in [k for k, (_, due) in self._expiring.items() if due <= now]:
            del self._expiring[key]
            self._touch(now)

    def _touch(self, now: float) -> None:
        if self._first is None:
            self._first = now
        self._due = min(now + self.debounce_s, self._first + self.max_wait_s)


def differs(current: tuple[Instance, ...] | None, desired: tuple[Instance, ...]) -> bool:
    """Whether writing ``desired`` would change anything (version 1 needs an instance)."""
    if current is None:
        return bool(desired)
    return tuple(sorted(current)) != desired
