"""The controller driver: turn the registered instances into config versions in etcd.

``Controller.run(stop)`` campaigns for the service's controller key (created
only if absent, on a lease of ``lease_ttl_s``; the holder keeps it alive).
The leader lists the instance prefix, seeds a ``VersionPlanner`` from the
current version, watches the prefix from the listing's revision and, when the
planner says a write is due, writes version N+1 with a compare-and-swap on
the ``mod_revision`` of the current-version key (plus a history key), and
only if the list differs from version N. Two controllers can therefore never
fork the history: the one that loses the swap re-reads and finds nothing to
do. Followers wait for the controller key to disappear and campaign again.
A leader whose lease is lost steps down; one that stops revokes its lease so
another takes over at once. Where it runs, and why: docs/adr/0004.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any

from ballast_asgi.discovery._loop import cancel_all, spawn, wait_any
from ballast_asgi.discovery.core.model import (
    ConfigVersion,
    DiscoveryError,
    Instance,
    Keys,
    Registration,
)
from ballast_asgi.discovery.core.versions import VersionPlanner, differs
from ballast_asgi.discovery.etcd import Etcd, EtcdUnavailable, KeyValue, WatchEvent

EventFn = Callable[[str, dict[str, Any]], None]


class _LostLeadership(Exception):
    """Our election lease is gone."""


class Controller:
    """Elected writer of config versions for one service."""

    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        *,
        debounce_s: float = 0.05,
        max_wait_s: float = 0.5,
        removal_grace_s: float = 2.0,
        lease_ttl_s: int = 3,
        identity: str | None = None,
        on_event: EventFn | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self.identity = identity or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.lease_ttl_s = lease_ttl_s
        self._planner_args = (debounce_s, max_wait_s, removal_grace_s)
        self.is_leader = False
        self.written = 0
        self.swaps_lost = 0
        self.last_written: ConfigVersion | None = None
        self._on_event = on_event or (lambda name, fields: None)
        self._wall = wall
        self._tasks: set[asyncio.Task[None]] = set()

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _emit(self, name: str, **fields: Any) -> None:
        self._on_event(name, {"identity": self.identity, "at": self._wall(), **fields})

    def snapshot(self) -> dict[str, Any]:
        """Leadership and write counters, JSON-safe."""
        last = self.last_written
        return {
            "identity": self.identity,
            "leader": self.is_leader,
            "versions_written": self.written,
            "swaps_lost": self.swaps_lost,
            "last_written": last.number if last else None,
        }

    # -- election ---------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Campaign, lead while elected, until ``stop`` is set."""
        backoff = 0.1
        while not stop.is_set():
            try:
                await self._term(stop)
                backoff = 0.1
            except EtcdUnavailable as exc:
                self._emit("etcd_unavailable", error=str(exc))
                await wait_any([stop], backoff)
                backoff = min(backoff * 2, 1.0)

    async def _term(self, stop: asyncio.Event) -> None:
        lease = await self.etcd.grant(self.lease_ttl_s)
        try:
            won, holder = await self.etcd.claim(self.keys.leader, self.identity.encode(), lease)
            if not won:
                await self.etcd.revoke(lease)
                await self._follow(stop, holder)
                return
            self.is_leader = True
            self._emit("elected", lease=lease)
            await self._lead_while_leased(stop, lease)
        finally:
            if self.is_leader:
                self.is_leader = False
                self._emit("stepped_down", lease=lease)
                with contextlib.suppress(EtcdUnavailable):  # else it expires by itself
                    await self.etcd.revoke(lease)

    async def _follow(self, stop: asyncio.Event, holder: KeyValue | None) -> None:
        """Wait until the controller key is gone (or ``stop``)."""
        if holder is None:
            return
        gone = spawn(self._until_deleted(self.keys.leader, holder.mod_revision + 1), self._tasks)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([gone, stopping], return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                gone.result()  # re-raises EtcdUnavailable
        finally:
            stopping.cancel()
            await cancel_all({gone})

    async def _until_deleted(self, key: bytes, start_revision: int) -> None:
        async for event in self.etcd.watch(key, prefix=False, start_revision=start_revision):
            if event.deleted:
                return
        raise EtcdUnavailable("watch ended")

    async def _lead_while_leased(self, stop: asyncio.Event, lease: int) -> None:
        lost = asyncio.Event()
        spawn(self._keep_lease(lease, lost), self._tasks)
        spawn(self._lead(lost), self._tasks)
        try:
            await wait_any([stop, lost], None)
        finally:
            await cancel_all(self._tasks)

    async def _keep_lease(self, lease: int, lost: asyncio.Event) -> None:
        interval = self.lease_ttl_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                if await self.etcd.keepalive(lease) <= 0:
                    self._emit("lease_lost", lease=lease)
                    lost.set()
                    return
            except EtcdUnavailable:
                continue  # keep trying; etcd extends leases when it comes back

    # -- leading ----------------------------------------------------------------
    async def _lead(self, lost: asyncio.Event) -> None:
        """List, watch, write; a broken watch starts over from a fresh listing."""
        planner = VersionPlanner(
            debounce_s=self._planner_args[0],
            max_wait_s=self._planner_args[1],
            removal_grace_s=self._planner_args[2],
        )
        seeded = False
        while True:
            try:
                revision = await self._relist(planner, seed=not seeded)
                seeded = True
                await self._follow_changes(planner, revision)
            except EtcdUnavailable as exc:
                self._emit("etcd_unavailable", error=str(exc))
                await asyncio.sleep(0.1)

    async def _relist(self, planner: VersionPlanner, *, seed: bool) -> int:
        kvs, revision = await self.etcd.get_prefix(self.keys.instances)
        now = self._now()
        if seed:
            current, _ = await self._read_current()
            listed = current.instances if current else ()
            planner.seed({self.keys.instance(i.url): i for i in listed}, now)
        planner.relist(_registrations(kvs), now)
        return revision

    async def _follow_changes(self, planner: VersionPlanner, revision: int) -> None:
        events: asyncio.Queue[WatchEvent | Exception] = asyncio.Queue()
        task = spawn(self._pump(revision, events), self._tasks)
        try:
            while True:
                wake = planner.wake_at()
                timeout = None if wake is None else max(0.0, wake - self._now())
                try:
                    item = await asyncio.wait_for(events.get(), timeout)
                except TimeoutError:
                    item = None
                if isinstance(item, Exception):
                    raise item
                if item is not None:
                    _apply(planner, item, self._now())
                desired = planner.take(self._now())
                if desired is not None:
                    await self._write(planner, desired, item.mod_revision if item else revision)
        finally:
            await cancel_all({task})

    async def _pump(self, revision: int, out: asyncio.Queue[WatchEvent | Exception]) -> None:
        try:
            prefix = self.keys.instances
            async for event in self.etcd.watch(prefix, prefix=True, start_revision=revision + 1):
                out.put_nowait(event)
        except EtcdUnavailable as exc:
            out.put_nowait(exc)
            return
        out.put_nowait(EtcdUnavailable("watch ended"))

    async def _read_current(self) -> tuple[ConfigVersion | None, int]:
        kv, _ = await self.etcd.get(self.keys.current)
        if kv is None:
            return None, 0
        try:
            return ConfigVersion.decode(kv.value), kv.mod_revision
        except DiscoveryError as exc:
            self._emit("bad_current", error=str(exc))
            return None, kv.mod_revision

    async def _write(
        self, planner: VersionPlanner, desired: tuple[Instance, ...], revision: int
    ) -> None:
        """Write version N+1 = ``desired`` if it differs from N, guarded by a swap."""
        try:
            current, mod_revision = await self._read_current()
            if not differs(current.instances if current else None, desired):
                return
            number = (current.number if current else 0) + 1
            version = ConfigVersion(number, desired, self._wall(), revision)
            value = version.encode()
            puts = [(self.keys.current, value), (self.keys.history(number), value)]
            if await self.etcd.swap(self.keys.current, mod_revision, puts):
                self.written += 1
                self.last_written = version
                self._emit("written", number=number, instances=[i.url for i in desired])
            else:
                self.swaps_lost += 1
                planner.retry(self._now())
        except EtcdUnavailable:
            planner.retry(self._now())
            raise


def _registrations(kvs: list[KeyValue]) -> dict[bytes, Registration]:
    out: dict[bytes, Registration] = {}
    for kv in kvs:
        try:
            out[kv.key] = Registration.decode(kv.value)
        except DiscoveryError:
            continue  # a malformed value is not an instance
    return out


def _apply(planner: VersionPlanner, event: WatchEvent, now: float) -> None:
    if event.deleted:
        planner.delete(event.key, now)
        return
    try:
        planner.put(event.key, Registration.decode(event.value), now)
    except DiscoveryError:
        planner.delete(event.key, now)
