"""The Redis client wrapper: scripts by SHA, one error type, latency measured per call.

Wraps ``redis.asyncio`` (redis-py). The connection pool is created on first
use inside the running event loop (a ``uvicorn --workers`` child builds its
own). Scripts run with ``EVALSHA``; a ``NOSCRIPT`` reply (Redis restarted or
flushed its script cache) loads the script again and retries once. Every
failure (connection refused or reset, timeout, a Redis error) surfaces as
``RedisUnavailable`` so drivers handle exactly one exception type. Cancellation
is never swallowed.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import MaxConnectionsError, NoScriptError, RedisError

from ballast_asgi.core.types import Clock
from ballast_asgi.ratelimit.scripts import SCRIPTS


class RedisUnavailable(Exception):
    """Redis did not answer usefully (refused, reset, timed out, or returned an error)."""


class RedisPoolFull(RedisUnavailable):
    """Every pooled connection is busy: this process is saturated, not Redis."""


class RedisClient:
    """Runs the rate-limit scripts against one Redis URL."""

    def __init__(
        self,
        url: str,
        *,
        socket_timeout_s: float = 1.0,
        max_connections: int = 64,
        clock: Clock = time.perf_counter,
    ) -> None:
        self.url = url
        self.socket_timeout_s = socket_timeout_s
        self.max_connections = max_connections
        self.clock = clock
        self._redis: aioredis.Redis | None = None
        self._shas = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in SCRIPTS.items()}

    def _conn(self) -> aioredis.Redis:
        if self._redis is None:
            self._redis = aioredis.Redis.from_url(
                self.url,
                socket_timeout=self.socket_timeout_s,
                socket_connect_timeout=self.socket_timeout_s,
                max_connections=self.max_connections,
                decode_responses=True,
            )
        return self._redis

    async def run(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Run script ``name``; raise ``RedisUnavailable`` on any failure."""
        conn = self._conn()
        try:
            try:
                return await conn.evalsha(self._shas[name], len(keys), *keys, *args)
            except NoScriptError:
                await conn.script_load(SCRIPTS[name])
                return await conn.evalsha(self._shas[name], len(keys), *keys, *args)
        except MaxConnectionsError as exc:
            raise RedisPoolFull(f"{type(exc).__name__}: {exc}") from exc
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def run_many(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run several scripts in one round trip (a pipeline); loads missing scripts first."""
        conn = self._conn()
        try:
            names = {name for name, _, _ in calls}
            exists = await conn.script_exists(*(self._shas[n] for n in names))
            for name, present in zip(names, exists, strict=True):
                if not present:
                    await conn.script_load(SCRIPTS[name])
            pipe = conn.pipeline(transaction=False)
            for name, keys, args in calls:
                pipe.evalsha(self._shas[name], len(keys), *keys, *args)
            return list(await pipe.execute())
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def warm_up(self) -> None:
        """Open a connection and load every script (so a first call is not a cold miss)."""
        conn = self._conn()
        try:
            for source in SCRIPTS.values():
                await conn.script_load(source)
        except (RedisError, OSError) as exc:
            raise RedisUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        """Close the pool (idempotent)."""
        if self._redis is not None:
            conn, self._redis = self._redis, None
            await conn.aclose()
