"""The etcd driver: a small async API over ``aetcd`` (gRPC), with endpoint failover.

Everything the discovery drivers need and nothing more: reads with their
revision, puts on a lease, a compare-and-swap on a key's ``mod_revision``,
lease grant / keep-alive / revoke, and watches from a revision. Every client
failure is translated here, once, into ``EtcdUnavailable``; after one, the
next call goes to the next endpoint (with one endpoint, the gRPC channel
reconnects by itself, with its backoff capped at ``reconnect_max_ms``).

Why ``aetcd``: docs/adr/0004-discovery-on-etcd.md.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rtypes

from ballast_asgi.discovery.core.model import DiscoveryError, parse_endpoint

#: gRPC channel options: reconnect quickly after etcd comes back.
_CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    # Notice a silently dead connection (a watch would wait forever); etcd allows
    # pings every 5 s or slower (--grpc-keepalive-min-time).
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 3_000,
}


class EtcdUnavailable(Exception):
    """etcd could not be reached or did not answer in time (the one error callers see)."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """A key, its value, its last-modified revision and its lease (0: none)."""

    key: bytes
    value: bytes
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """A change seen by a watch; ``value`` is empty for a delete."""

    key: bytes
    value: bytes
    mod_revision: int
    deleted: bool


class Etcd:
    """One logical etcd connection over one or more endpoints."""

    def __init__(
        self, endpoints: Sequence[str], *, timeout_s: float = 2.0, reconnect_max_ms: int = 1000
    ) -> None:
        if not endpoints:
            raise DiscoveryError("etcd endpoints: give at least one, e.g. http://127.0.0.1:2379")
        self.endpoints = [parse_endpoint(e) for e in endpoints]
        self.timeout_s = timeout_s
        self._options = {**_CHANNEL_OPTIONS, "grpc.max_reconnect_backoff_ms": reconnect_max_ms}
        self._index = 0
        self._client: Any = None

    @property
    def endpoint(self) -> str:
        """The endpoint in use, ``host:port``."""
        host, port = self.endpoints[self._index]
        return f"{host}:{port}"

    def _get(self) -> Any:
        if self._client is None:
            host, port = self.endpoints[self._index]
            self._client = aetcd.Client(
                host=host, port=port, timeout=self.timeout_s, options=self._options
            )
        return self._client

    async def _failed(self, exc: BaseException) -> EtcdUnavailable:
        """Translate a client failure; switch endpoint when there are several."""
        if len(self.endpoints) > 1:
            client, self._client = self._client, None
            self._index = (self._index + 1) % len(self.endpoints)
            if client is not None:
                await _close_quietly(client)
        return EtcdUnavailable(f"etcd {self.endpoint}: {type(exc).__name__}: {exc}")

    async def aclose(self) -> None:
        """Close the connection (idempotent)."""
        client, self._client = self._client, None
        if client is not None:
            await _close_quietly(client)

    # -- reads ------------------------------------------------------------------
    async def get(self, key: bytes) -> tuple[KeyValue | None, int]:
        """The key (or ``None``) and the store revision of the read."""
        client = self._get()
        try:
            await client.connect()
            got = await client.kvstub.Range(
                aetcd.rpc.RangeRequest(key=key), timeout=self.timeout_s, metadata=client.metadata
            )
        except _ERRORS as exc:
            raise await self._failed(exc) from None
        kvs = [_kv(kv) for kv in got.kvs]
        return (kvs[0] if kvs else None), int(got.header.revision)

    async def get_prefix(self, prefix: bytes) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix`` and the store revision of the read."""
        try:
            got = await self._get().get_prefix(prefix)
        except _ERRORS as exc:
            raise await self._failed(exc) from None
        return [_kv(kv) for kv in got.kvs], int(got.header.revision)

    # -- writes -----------------------------------------------------------------
    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        """Write ``key``; the revision of the write."""
        try:
            got = await self._get().put(key, value, lease=lease or None)
        except _ERRORS as exc:
            raise await self._failed(exc) from None
        return int(got.header.revision)

    async def delete(self, key: bytes) -> None:
        """Delete ``key`` (no error when absent)."""
        try:
            await self._get().delete(key)
        except _ERRORS as exc:
            raise await self._failed(exc) from None

    async def swap(
        self, guard: bytes, mod_revision: int, puts: Sequence[tuple[bytes, bytes]]
    ) -> bool:
        """Write ``puts`` only if ``guard`` still has ``mod_revision`` (0: does not exist)."""
        client = self._get()
        tx = client.transactions
        compare = (tx.mod(guard) == mod_revision) if mod_revision else (tx.create(guard) == 0)
        try:
            ok, _ = await client.transaction(
                compare=[compare], success=[tx.put(k, v) for k, v in puts], failure=[]
            )
        except _ERRORS as exc:
            raise await self._failed(exc) from None
        return bool(ok)

    async def claim(self, key: bytes, value: bytes, lease: int) -> tuple[bool, KeyValue | None]:
        """Create ``key`` on ``lease`` if absent: (won, the holder's key when we did not)."""
        client = self._get()
        tx = client.transactions
        try:
            ok, responses = await client.transaction(
                compare=[tx.create(key) == 0],
                success=[tx.put(key, value, lease=lease)],
                failure=[tx.get(key)],
            )
        except _ERRORS as exc:
            raise await self._failed(exc) from None
        if ok:
            return True, None
        holder = [_kv(got) for _, got in responses[0]]
        return False, holder[0] if holder else None

    # -- leases -----------------------------------------------------------------
    async def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; its id."""
        try:
            lease = await self._get().lease(ttl_s)
        except _ERRORS as exc:
            raise await self._failed(exc) from None
        return int(lease.id)

    async def keepalive(self, lease: int) -> int:
        """Refresh ``lease``; its remaining TTL in seconds (<= 0: etcd no longer has it)."""
        try:
            reply = await self._get().refresh_lease(lease)
        except _ERRORS as exc:
            raise await self._failed(exc) from None
        return int(reply.TTL) if reply is not None else 0

    async def revoke(self, lease: int) -> None:
        """Revoke ``lease`` (its keys go with it); no error when it is already gone."""
        try:
            await self._get().revoke_lease(lease)
        except aetcd.exceptions.ClientError as exc:
            if "not found" in str(exc):
                return
            raise await self._failed(exc) from None

    # -- watches ----------------------------------------------------------------
    async def watch(
        self, key: bytes, *, prefix: bool, start_revision: int
    ) -> AsyncIterator[WatchEvent]:
        """Changes of ``key`` (or under it) from ``start_revision``; raises when it breaks."""
        client = self._get()
        try:
            if prefix:
                watch = await client.watch_prefix(key, start_revision=start_revision)
            else:
                watch = await client.watch(key, start_revision=start_revision)
        except _ERRORS as exc:
            raise await self._failed(exc) from None
        try:
            async for event in watch:
                kv = event.kv
                yield WatchEvent(
                    bytes(kv.key),
                    bytes(kv.value),
                    int(kv.mod_revision),
                    event.kind == aetcd.rtypes.EventKind.DELETE,
                )
        except _ERRORS as exc:
            raise await self._failed(exc) from None
        finally:
            await _cancel_quietly(watch)


_ERRORS = (aetcd.exceptions.ClientError, aetcd.rpc.AioRpcError, OSError, TimeoutError)


def _kv(kv: Any) -> KeyValue:
    return KeyValue(bytes(kv.key), bytes(kv.value), int(kv.mod_revision), int(kv.lease))


async def _close_quietly(client: Any) -> None:
    try:
        await client.close()
    except Exception:  # closing a broken channel may fail in many ways
        return


async def _cancel_quietly(watch: Any) -> None:
    try:
        await watch.cancel()
    except Exception:  # the stream may already be gone
        return
