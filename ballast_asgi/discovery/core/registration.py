"""The registration state machine of one instance (pure).

States and what the driver does in each (``next_step(now)`` says which and when)::

    unregistered --GRANT--> registered --KEEPALIVE every ttl/3--> registered
         ^                      |  keep-alive says the lease is gone (TTL <= 0),
         |                      |  or our key was deleted by someone else
         +------- lost ---------+  -> GRANT again: same key, same value
    registered --stop--> leaving --LEAVE (mark leaving, delete, revoke)--> gone

* A failed call (etcd unreachable) leaves the state as it is and retries
  after a backoff that doubles from ``retry_s`` to ``max_retry_s``; it is
  reset by the next success. Losing contact is not losing the lease: the
  lease is only known lost when etcd says so (etcd 3.4 also extends every
  lease by its TTL when it restarts or elects a leader).
* ``lost`` counts lease losses, ``grants`` every lease obtained.

Times are monotonic seconds passed in by the caller.
"""

from __future__ import annotations

import enum


class Step(enum.Enum):
    """What the driver should do next."""

    GRANT = "grant"  # grant a lease and put the key on it
    KEEPALIVE = "keepalive"  # refresh the lease
    LEAVE = "leave"  # mark leaving, delete the key, revoke the lease
    DONE = "done"  # nothing left to do


class RegistrationCore:
    """When to grant, keep alive, re-register and leave."""

    def __init__(
        self,
        ttl_s: int,
        *,
        keepalive_fraction: float = 1 / 3,
        retry_s: float = 0.1,
        max_retry_s: float = 1.0,
    ) -> None:
        if ttl_s < 1:
            raise ValueError(f"ttl must be >= 1 s, got {ttl_s}")
        if not 0.0 < keepalive_fraction < 1.0 or not 0.0 < retry_s <= max_retry_s:
            raise ValueError("need 0 < keepalive_fraction < 1 and 0 < retry_s <= max_retry_s")
        self.ttl_s = ttl_s
        self.keepalive_s = ttl_s * keepalive_fraction
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self.state = "unregistered"
        self.lease_id: int | None = None
        self.grants = 0
        self.lost = 0
        self.failures = 0
        self._at = 0.0
        self._backoff = retry_s

    def next_step(self) -> tuple[Step, float]:
        """The next step and the monotonic time it is due."""
        if self.state == "unregistered":
            return Step.GRANT, self._at
        if self.state == "registered":
            return Step.KEEPALIVE, self._at
        if self.state == "leaving":
            return Step.LEAVE, self._at
        return Step.DONE, self._at

    def granted(self, lease_id: int, now: float) -> None:
        """A lease was granted and the key put on it."""
        if self.state != "unregistered":
            return
        self.state = "registered"
        self.lease_id = lease_id
        self.grants += 1
        self._ok(now)

    def kept(self, ttl_left_s: float, now: float) -> None:
        """A keep-alive answered; a TTL <= 0 means etcd no longer has the lease."""
        if self.state != "registered":
            return
        if ttl_left_s <= 0:
            self.on_lost(now)
            return
        self._ok(now)

    def on_lost(self, now: float) -> None:
        """The lease or our key is gone: register again at once, same key and value."""
        if self.state != "registered":
            return
        self.state = "unregistered"
        self.lease_id = None
        self.lost += 1
        self._at = now

    def failed(self, now: float) -> None:
        """A call failed (etcd unreachable or slow): retry the same step after a backoff."""
        self.failures += 1
        self._at = now + self._backoff
        self._backoff = min(self._backoff * 2, self.max_retry_s)

    def stop(self, now: float) -> None:
        """Leave: deregister if registered, else finish."""
        if self.state in ("registered", "leaving"):
            self.state = "leaving"
            self._at = now
        else:
            self.state = "gone"

    def left(self) -> None:
        """Deregistration finished (or was given up)."""
        self.state = "gone"
        self.lease_id = None

    def _ok(self, now: float) -> None:
        self._backoff = self.retry_s
        self._at = now + self.keepalive_s
