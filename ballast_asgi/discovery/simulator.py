"""``ballast-upstream --register-etcd URL --service NAME``: the simulator registers itself.

The simulator starts serving, then registers its own traffic URL; on
SIGINT/SIGTERM it deregisters first (marked ``leaving``: the gateways stop
sending new requests to it) and only then stops serving.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from ballast_asgi.discovery.core.model import (
    DiscoveryError,
    Instance,
    Keys,
    check_service,
    check_version,
    parse_endpoint,
)

#: How long the simulator waits for its deregistration before it stops anyway.
LEAVE_TIMEOUT_S = 3.0


def check_args(endpoints: str, service: str | None, version: str, ttl_s: int) -> str | None:
    """A message naming the bad flag, or None."""
    try:
        for url in endpoints.split(","):
            parse_endpoint(url.strip())
        if not service:
            return "--service: required with --register-etcd"
        check_service(service)
        if version:
            check_version(version)
    except DiscoveryError as exc:
        return str(exc)
    if not 1 <= ttl_s <= 300:
        return f"--ttl: must be in 1..300 seconds, got {ttl_s}"
    return None


def register_in_background(
    endpoints: str, service: str, url: str, *, version: str = "", ttl_s: int = 5
) -> Callable[[asyncio.Event], Awaitable[None]]:
    """Start a registrar task; the returned function stops it (deregisters) and waits."""
    from ballast_asgi.discovery.etcd import Etcd
    from ballast_asgi.discovery.registrar import Registrar

    etcd = Etcd([u.strip() for u in endpoints.split(",")])
    registrar = Registrar(etcd, Keys(service), Instance(url, version), ttl_s=ttl_s,
                          on_event=_print_event)  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.ensure_future(registrar.run(stop))

    async def deregister(_: asyncio.Event) -> None:
        stop.set()
        try:
            await asyncio.wait_for(task, LEAVE_TIMEOUT_S)
        except TimeoutError:
            pass
        finally:
            await etcd.aclose()

    return deregister


def _print_event(name: str, fields: dict[str, Any]) -> None:
    print(json.dumps({"event": name, **fields}, sort_keys=True), file=sys.stderr, flush=True)
