"""The registration driver: keep one instance registered in etcd until told to stop.

``Registrar.run(stop)`` follows ``RegistrationCore``: grant a lease of ``ttl_s``
seconds and put the instance key on it, refresh the lease every ``ttl_s / 3``,
and register again (same key, same value) as soon as the lease is known to be
lost: a keep-alive answering TTL 0, or a watch on its own key seeing it
deleted by someone else. On ``stop`` it deregisters: it marks the value
``leaving`` (the controller drops the instance at once instead of waiting for
the removal grace), deletes the key and revokes the lease, within
``leave_timeout_s``; if etcd cannot be reached the lease simply expires.

``on_event(name, fields)`` hears ``registered``, ``lost``, ``failed`` and
``left`` (``ballast register`` prints them as JSON lines).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ballast_asgi.discovery._loop import cancel_all, spawn, wait_any
from ballast_asgi.discovery.core.model import Instance, Keys, Registration
from ballast_asgi.discovery.core.registration import RegistrationCore, Step
from ballast_asgi.discovery.etcd import Etcd, EtcdUnavailable

EventFn = Callable[[str, dict[str, Any]], None]


class Registrar:
    """Registers ``instance`` under ``keys`` and keeps it registered."""

    def __init__(
        self,
        etcd: Etcd,
        keys: Keys,
        instance: Instance,
        *,
        ttl_s: int = 5,
        leave_timeout_s: float = 2.0,
        on_event: EventFn | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.etcd = etcd
        self.keys = keys
        self.instance = instance
        self.key = keys.instance(instance.url)
        self.core = RegistrationCore(ttl_s)
        self.leave_timeout_s = leave_timeout_s
        self.revision = 0
        self._on_event = on_event or (lambda name, fields: None)
        self._wall = wall
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _emit(self, name: str, **fields: Any) -> None:
        self._on_event(name, {"url": self.instance.url, "at": self._wall(), **fields})

    async def run(self, stop: asyncio.Event) -> None:
        """Register, keep registered, deregister once ``stop`` is set."""
        spawn(self._watch_own_key(), self._tasks)
        try:
            while True:
                step, at = self.core.next_step()
                if step is Step.DONE:
                    return
                if step is not Step.LEAVE:
                    await wait_any([stop, self._wake], at - self._now())
                    self._wake.clear()
                    if stop.is_set():
                        self.core.stop(self._now())
                        continue
                    if self._now() < self.core.next_step()[1]:
                        continue
                await self._do(self.core.next_step()[0])
        finally:
            await cancel_all(self._tasks)

    async def _do(self, step: Step) -> None:
        try:
            if step is Step.GRANT:
                await self._register()
            elif step is Step.KEEPALIVE:
                await self._keepalive()
            elif step is Step.LEAVE:
                await self._leave()
        except EtcdUnavailable as exc:
            self.core.failed(self._now())
            self._emit("failed", step=step.value, error=str(exc))

    async def _register(self) -> None:
        lease = await self.etcd.grant(self.core.ttl_s)
        value = Registration(self.instance).encode()
        try:
            self.revision = await self.etcd.put(self.key, value, lease=lease)
        except EtcdUnavailable:
            await _quietly(self.etcd.revoke(lease))
            raise
        self.core.granted(lease, self._now())
        self._emit("registered", lease=lease, revision=self.revision, key=self.key.decode())

    async def _keepalive(self) -> None:
        lease = self.core.lease_id
        assert lease is not None
        ttl = await self.etcd.keepalive(lease)
        self.core.kept(ttl, self._now())
        if self.core.state == "unregistered":
            self._emit("lost", lease=lease, why="keep-alive: lease not found")

    async def _leave(self) -> None:
        lease = self.core.lease_id
        try:
            async with asyncio.timeout(self.leave_timeout_s):
                if lease is not None:
                    leaving = Registration(self.instance, leaving=True).encode()
                    await self.etcd.put(self.key, leaving, lease=lease)
                    await self.etcd.delete(self.key)
                    await self.etcd.revoke(lease)
        except (EtcdUnavailable, TimeoutError) as exc:
            self._emit("failed", step="leave", error=str(exc) or "timeout")
        self.core.left()
        self._emit("left", lease=lease)

    async def _watch_own_key(self) -> None:
        """Re-register at once when our key is deleted by anyone but us."""
        while True:
            try:
                start = self.revision + 1 if self.revision else (await self.etcd.get(self.key))[1]
                async for event in self.etcd.watch(self.key, prefix=False, start_revision=start):
                    if event.deleted and event.mod_revision > self.revision:
                        self._key_lost()
            except EtcdUnavailable:
                pass
            await asyncio.sleep(self.core.retry_s)  # the watch broke or ended: start it again

    def _key_lost(self) -> None:
        if self.core.state != "registered":
            return
        lease = self.core.lease_id
        self.core.on_lost(self._now())
        self._emit("lost", lease=lease, why="key deleted")
        self._wake.set()
        if lease is not None:
            spawn(_quietly(self.etcd.revoke(lease)), self._tasks)


async def _quietly(coro: Any) -> None:
    try:
        await coro
    except EtcdUnavailable:
        return
