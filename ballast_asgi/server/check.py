"""``ballast check-config FILE [--connect]``: what start-up would refuse, found without starting.

``check(path)`` validates the file as the gateway loads it (``check_file``:
every key, URL, port, certificate and key, through the same validators start-up
runs) and then builds the gateway from it (``build_gateway``: the same
composition start-up runs, no socket opened), so a config that passes also
starts. The first problem is one line naming the key; no traceback.

``--connect`` then tries what the config depends on, each bounded by
``timeout_s``: a TCP connection (and a TLS handshake for https) to every
upstream and canary instance, ``PING`` to Redis when a shared rate-limit mode
is on, a read of the service's key from etcd when discovery is on. One line
per dependency; any failure makes the exit status non-zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.redact import redact_userinfo

if TYPE_CHECKING:
    from ballast_asgi.config import GatewayConfig

#: One dependency tried: (ok, the line to print).
Result = tuple[bool, str]


def check(path: str) -> GatewayConfig:
    """The validated config of ``path``; ``ConfigError`` (one line) when start-up would fail."""
    from ballast_asgi.config.load import check_file
    from ballast_asgi.gateway import build_gateway

    config = check_file(path)
    if config.upstream is None and config.discovery is None:
        return config  # the upstream may come from BALLAST_UPSTREAM at start-up
    try:
        build_gateway(config)
    except ConfigError:
        raise
    except (ValueError, OSError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return config


async def connect(config: GatewayConfig, timeout_s: float = 2.0) -> list[Result]:
    """Try every upstream, Redis and etcd the config names; one result each."""
    tries: list[tuple[str, Callable[[], Awaitable[None]]]] = []
    urls = [i.url for i in config.instances]
    canary = config.canary.upstream
    urls += [] if canary is None else [canary] if isinstance(canary, str) else list(canary)
    tries += [(f"upstream {redact_userinfo(u)}", _tcp(u, timeout_s)) for u in urls]
    rl = config.rate_limit
    if rl.enabled and rl.mode != "local":
        tries.append((f"redis {redact_userinfo(rl.redis_url)}", _redis(rl.redis_url, timeout_s)))
    if config.discovery is not None:
        d = config.discovery
        name = f"etcd {','.join(d.etcd.endpoints)} (service {d.service})"
        tries.append((name, _etcd(config, timeout_s)))
    return list(await asyncio.gather(*(_one(what, fn, timeout_s) for what, fn in tries)))


async def _one(what: str, fn: Callable[[], Awaitable[None]], timeout_s: float) -> Result:
    start = time.perf_counter()
    try:
        await asyncio.wait_for(fn(), timeout_s)
    except TimeoutError:
        return False, f"unreachable: {what}: no answer within {timeout_s:g} s"
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        reason = reason.split(" <AioRpcError")[0].rstrip(": ")  # gRPC's repr is many lines
        return False, f"unreachable: {what}: {redact_userinfo(reason)}"
    return True, f"reachable: {what} ({(time.perf_counter() - start) * 1000:.1f} ms)"


def _tcp(url: str, timeout_s: float) -> Callable[[], Awaitable[None]]:
    from ballast_asgi.proxy.upstream import Upstream

    up = Upstream.parse(url)

    async def go() -> None:
        context = ssl.create_default_context() if up.scheme == "https" else None
        _, writer = await asyncio.open_connection(
            up.host, up.port, ssl=context, server_hostname=up.host if context else None
        )
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()

    return go


def _redis(url: str, timeout_s: float) -> Callable[[], Awaitable[None]]:
    async def go() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url, socket_connect_timeout=timeout_s)
        try:
            await client.ping()
        finally:
            await client.aclose()

    return go


def _etcd(config: GatewayConfig, timeout_s: float) -> Callable[[], Awaitable[None]]:
    async def go() -> None:
        from ballast_asgi.discovery.core.model import Keys
        from ballast_asgi.discovery.etcd import Etcd

        assert config.discovery is not None
        d = config.discovery
        etcd = Etcd(d.etcd.endpoints, timeout_s=timeout_s)
        try:
            await etcd.get(Keys(d.service, d.etcd.prefix).current)
        finally:
            await etcd.aclose()

    return go
