"""Discovery inside one gateway: follower (+ elected controller), lifespan, snapshot.

``DiscoveryRuntime(config, apply)`` owns the gateway's etcd side: a
``Follower`` that applies each config version through ``apply(instances)``
(the composition's swap of the pool's instances, ``gateway/compose.py``) and, with
``discovery.controller: true``, a ``Controller`` that campaigns for the
service's controller key (docs/adr/0004). ``wrap(app)`` starts both at
lifespan start-up (or at the first request when no lifespan runs) and stops
them at shutdown (the controller revokes its lease so another gateway takes
over at once). Until a first version is applied, a gateway configured with
no ``upstream`` answers 503 (``no_instances``, ``Retry-After: 1``) instead of
guessing; one with an ``upstream`` uses it until then.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ballast_asgi.core.types import ASGIApp, Message, Receive, Scope, Send
from ballast_asgi.discovery.core.model import ConfigVersion, Instance, Keys
from ballast_asgi.middleware.responses import send_json

if TYPE_CHECKING:
    from ballast_asgi.config.models import DiscoveryConfig
    from ballast_asgi.discovery.controller import Controller
    from ballast_asgi.discovery.follower import Follower

ApplyFn = Callable[[Sequence[Instance]], None]
_NO_INSTANCES: dict[str, object] = {
    "error": "no_instances",
    "message": "discovery: no config version with instances has been applied yet",
}


class DiscoveryRuntime:
    """The follower and the optional controller of one gateway."""

    def __init__(
        self,
        config: DiscoveryConfig,
        apply: ApplyFn,
        *,
        bootstrapped: bool = False,
        wall: Callable[[], float] = time.time,
    ) -> None:
        from ballast_asgi.discovery.controller import Controller
        from ballast_asgi.discovery.etcd import Etcd
        from ballast_asgi.discovery.follower import Follower

        self.config = config
        self.keys = Keys(config.service, config.etcd.prefix)
        timeout_s = config.etcd.timeout_ms / 1000.0
        self._apply = apply
        self.follower: Follower = Follower(
            Etcd(config.etcd.endpoints, timeout_s=timeout_s), self.keys, self._swap, wall=wall
        )
        self.controller: Controller | None = None
        if config.controller:
            self.controller = Controller(
                Etcd(config.etcd.endpoints, timeout_s=timeout_s),
                self.keys,
                debounce_s=config.debounce_ms / 1000.0,
                max_wait_s=config.max_wait_ms / 1000.0,
                removal_grace_s=config.removal_grace_ms / 1000.0,
                lease_ttl_s=config.election_ttl_s,
                wall=wall,
            )
        self.bootstrapped = bootstrapped
        self._stop: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def register_metrics(self, registry: Any) -> None:
        """Add the ``ballast_discovery_*`` series to the gateway's registry."""
        from ballast_asgi.discovery.metrics import register

        register(registry, self)

    def _swap(self, version: ConfigVersion) -> None:
        self._apply(version.instances)

    @property
    def serving(self) -> bool:
        """Whether the gateway has instances to send traffic to."""
        return self.bootstrapped or self.follower.current is not None

    def start(self) -> None:
        """Start following (and campaigning); idempotent; needs a running loop."""
        if self._stop is not None:
            return
        self._stop = asyncio.Event()
        runners: list[Any] = [self.follower]
        if self.controller is not None:
            runners.append(self.controller)
        self._tasks = [asyncio.ensure_future(r.run(self._stop)) for r in runners]

    async def stop(self) -> None:
        """Stop following and leading; close the etcd connections (idempotent)."""
        stop, self._stop = self._stop, None
        if stop is None:
            return
        stop.set()
        tasks, self._tasks = self._tasks, []
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5.0)
        await self.follower.etcd.aclose()
        if self.controller is not None:
            await self.controller.etcd.aclose()

    @property
    def config_version(self) -> int | None:
        """The number of the config version applied (None before the first)."""
        current = self.follower.current
        return current.number if current else None

    def degraded(self) -> list[str]:
        """Reasons for health ``degraded``: etcd not reachable, or no version applied yet."""
        f = self.follower
        out = []
        if not f.connected and f.errors:
            out.append(f"discovery: etcd {f.etcd.endpoint} unreachable ({f.last_error}); "
                       "serving the last applied version")  # fmt: skip
        if not self.serving:
            out.append("discovery: no config version applied yet")
        return out

    def snapshot(self) -> dict[str, Any]:
        """``/snapshot``'s ``discovery`` section."""
        doc = self.follower.snapshot()
        doc["controller"] = self.controller.snapshot() if self.controller else None
        return doc

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """``app`` with this runtime started and stopped by lifespan (503 before a version)."""
        return _WithDiscovery(app, self)


#: An unavailability answer, like ``breaker_open``: 503 with Retry-After and the reason.
_NO_INSTANCES_HEADERS = [(b"retry-after", b"1"), (b"x-ballast-reason", b"no_instances")]


class _WithDiscovery:
    """Lifespan starts/stops discovery; requests wait for nothing but get 503 without instances."""

    def __init__(self, app: ASGIApp, runtime: DiscoveryRuntime) -> None:
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = self.runtime
        if scope["type"] == "lifespan":
            await self.app(scope, self._watch(receive), send)
            return
        runtime.start()
        if scope["type"] == "http" and not runtime.serving:
            await send_json(send, 503, _NO_INSTANCES, _NO_INSTANCES_HEADERS)
            return
        await self.app(scope, receive, send)

    def _watch(self, receive: Receive) -> Receive:
        async def watch() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.runtime.start()
            elif message["type"] == "lifespan.shutdown":
                await asyncio.shield(self.runtime.stop())
            return message

        return watch
