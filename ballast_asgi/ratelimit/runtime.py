"""One gateway's live rate-limit state: the driver and the key resolver, swappable on reload."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any

from ballast_asgi.config.ratelimit import RateLimitConfig
from ballast_asgi.core.types import Clock
from ballast_asgi.ratelimit.factory import RateLimiter, make_limiter, make_resolver

#: Changing any of these needs a new driver (and its Redis connections).
_DRIVER_KEYS = frozenset(RateLimitConfig.model_fields) - {
    "enabled", "key", "rate_per_s", "burst", "routes", "overrides",
}  # fmt: skip


class RateLimitRuntime:
    """Holds the current limiter and resolver; the middleware and metrics read them here."""

    def __init__(
        self, config: RateLimitConfig, *, consumer_header: str = "x-api-key",
        clock: Clock = time.monotonic,
    ) -> None:  # fmt: skip
        self.config = config
        self.clock = clock
        self.consumer_header = consumer_header
        self.limiter: RateLimiter = make_limiter(config, clock=clock)
        self.resolver = make_resolver(config, consumer_header)
        self._retired: set[asyncio.Task[None]] = set()

    def degraded(self) -> list[str]:
        """Reasons for health ``degraded`` (Redis lost by a shared mode), else empty."""
        check = getattr(self.limiter, "lost_reasons", None)
        return list(check()) if check is not None else []

    def reconfigure(self, config: RateLimitConfig, consumer_header: str) -> None:
        """Apply a new section; a new driver only when a driver setting changed."""
        old, self.config = self.config, config
        self.consumer_header = consumer_header
        self.resolver = make_resolver(config, consumer_header)
        if any(getattr(old, k) != getattr(config, k) for k in _DRIVER_KEYS):
            retired, self.limiter = self.limiter, make_limiter(config, clock=self.clock)
            with contextlib.suppress(RuntimeError):  # no running loop: nothing was started
                self._background(retired.close())
                self._background(self.limiter.start())

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:
            coro.close()
            raise
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    async def drain_background(self) -> None:
        """Wait for the reload's start/close tasks (tests, and an orderly shutdown)."""
        await asyncio.gather(*self._retired, return_exceptions=True)

    async def start(self) -> None:
        """Start the current driver (its loops, and a first count of live gateways)."""
        await self.limiter.start()

    async def close(self) -> None:
        """Stop the current driver (after a reload's pending start and close)."""
        await self.drain_background()
        await self.limiter.close()

    def snapshot(self) -> dict[str, Any]:
        """Config summary plus the driver's state."""
        c = self.config
        return {
            "enabled": c.enabled,
            "key": c.key,
            "rate_per_s": c.rate_per_s,
            "burst": c.burst,
            **self.limiter.snapshot(),
        }
