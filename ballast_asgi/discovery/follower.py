"""The gateway side: follow the service's current config version and apply it.

``Follower.run(stop)`` reads the current-version key, applies it, then watches
the key from the read's revision and applies every newer version as it
arrives. ``apply(version)`` is the gateway's atomic swap of its upstream list
(new requests use the new list; attempts already out finish on the old one).

When etcd cannot be reached the gateway keeps the last applied version and
keeps serving; the follower retries (100 ms doubling to 1 s) and, on
reconnecting, reads the current key again, so it catches up with everything
written meanwhile. A value that does not parse, or that ``apply`` refuses
(e.g. an empty list: a pool needs at least one instance), is counted and
skipped; the last good version stays.

``snapshot()`` is what ``/snapshot`` shows under ``discovery``:
``config_version``, ``applied_at`` (unix seconds), ``instances``, the etcd
connection state and the last versions applied.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

from ballast_asgi.discovery._loop import until_stopped, wait_any
from ballast_asgi.discovery.core.model import ConfigVersion, DiscoveryError, Keys
from ballast_asgi.discovery.etcd import Etcd, EtcdUnavailable
from ballast_asgi.telemetry.events import emit

ApplyFn = Callable[[ConfigVersion], None]
_HISTORY = 64


class Follower:
    """Applies config versions of one service as they are written."""

    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        apply: ApplyFn,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self._apply = apply
        self._wall = wall
        self.current: ConfigVersion | None = None
        self.applied_at: float | None = None
        self.connected = False
        self.errors = 0
        self.rejected = 0
        self.last_error: str | None = None
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=_HISTORY)
        self.changed = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Follow until ``stop`` is set; never raises for etcd trouble."""
        backoff = 0.1
        while not stop.is_set():
            try:
                await until_stopped(self._follow(), stop)
            except EtcdUnavailable as exc:
                self._lost(exc)
                self.connected = False
                self.errors += 1
                self.last_error = str(exc)
                await wait_any([stop], backoff)
                backoff = min(backoff * 2, 1.0)
                continue
            backoff = 0.1

    async def _follow(self) -> None:
        kv, revision = await self.etcd.get(self.keys.current)
        if self.errors and not self.connected:
            emit("discovery.etcd_back", "info", service=self.keys.service,
                 endpoint=self.etcd.endpoint, errors=self.errors)  # fmt: skip
        self.connected = True
        if kv is not None:
            self.offer(kv.value)
        async for event in self.etcd.watch(
            self.keys.current, prefix=False, start_revision=revision + 1
        ):
            if not event.deleted:
                self.offer(event.value)
        raise EtcdUnavailable("watch ended")

    def offer(self, raw: bytes) -> bool:
        """Apply the version in ``raw`` if it is new; whether it was applied."""
        try:
            version = ConfigVersion.decode(raw)
        except DiscoveryError as exc:
            return self._reject(str(exc))
        current = self.current
        if current is not None and version.number == current.number:
            return False
        if not version.instances:
            return self._reject(f"config version {version.number} lists no instance; kept the last")
        try:
            self._apply(version)
        except ValueError as exc:
            return self._reject(f"config version {version.number}: {exc}")
        self.current = version
        self.applied_at = self._wall()
        self.history.append(
            {
                "config_version": version.number,
                "applied_at": self.applied_at,
                "instances": [i.url for i in version.instances],
            }
        )
        self.changed.set()
        emit("discovery.version_applied", "info", service=self.keys.service,
             config_version=version.number, instances=len(version.instances))  # fmt: skip
        return True

    def _reject(self, why: str) -> bool:
        self.rejected += 1
        self.last_error = why
        emit("discovery.version_rejected", "warning", service=self.keys.service, reason=why)
        return False

    def _lost(self, exc: Exception) -> None:
        """Log etcd unreachable (never reached yet) or lost (was connected): changes only."""
        if self.connected or not self.errors:
            event = "discovery.etcd_lost" if self.connected else "discovery.etcd_unreachable"
            kept = self.current.number if self.current else None
            emit(event, "warning", service=self.keys.service, endpoint=self.etcd.endpoint,
                 error=str(exc), kept_version=kept)  # fmt: skip

    def snapshot(self) -> dict[str, Any]:
        """The applied version and the connection state, JSON-safe."""
        current = self.current
        return {
            "service": self.keys.service,
            "config_version": current.number if current else None,
            "applied_at": self.applied_at,
            "written_at": current.written_at if current else None,
            "instances": [i.to_json() for i in current.instances] if current else [],
            "etcd": {
                "endpoint": self.etcd.endpoint,
                "connected": self.connected,
                "errors": self.errors,
                "last_error": self.last_error,
            },
            "rejected": self.rejected,
            "history": list(self.history),
        }
