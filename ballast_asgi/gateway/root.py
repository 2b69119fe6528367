"""The composition root: one config object in, the whole stack out.

``build_gateway(config, ...)`` wires the stateful collaborators (limiter,
queue, breaker, retry budget, proxy) and the stages around them::

    AdminRouter -> Admission -> Queue -> Concurrency -> Breaker -> ProxyApp

``ballast_asgi.gateway:app`` is built from the environment on first access
(``BALLAST_UPSTREAM``, ``BALLAST_LIMITER``, ``BALLAST_FIXED_LIMIT``,
``BALLAST_CONFIG``), so a bad setting stops ``uvicorn`` at start-up with one
line naming it, instead of failing at the first request.

Forwarded headers: ``scope["client"]`` stays the direct TCP peer (what
``priority.trusted_networks`` is checked against and what the proxy appends to
``X-Forwarded-For``); ``proxy.trusted_proxies`` decides whose
``X-Forwarded-For``/``-Proto`` are believed (``ballast_asgi.core.forwarded``).
When uvicorn imports ``app`` the server package adopts it (through
``core.adopt``; ``ballast_asgi.server.serve.adopt_loading``): its own
proxy-headers rewrite, its ``date``/``server`` headers are turned off and the
guarded protocol is installed (or pass ``--http
ballast_asgi.server.serve:GatewayProtocol``, which does the same from the
config uvicorn hands it). A scope whose client
was nevertheless rewritten from ``X-Forwarded-For`` (uvicorn run some other
way) gets ``client = None``: never trusted, one warning.

What the gateway shows (its pieces by name, health, snapshot) is
``GatewayViews`` in ``views.py``; this module builds, serves and reloads.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from ballast_asgi.canary.asgi import CanaryAdmin
from ballast_asgi.config import GatewayConfig, load_config
from ballast_asgi.config.workers import read_live, scale_config
from ballast_asgi.core.errors import ConfigError
from ballast_asgi.core.forwarded import (
    CLIENT_IP_KEY,
    ForwardedTrust,
    forwarded_entries,
    rewritten_by_server,
)
from ballast_asgi.core.redact import redact_userinfo
from ballast_asgi.core.types import ASGIApp, Clock, Message, Receive, Scope, Send
from ballast_asgi.discovery.core.model import Instance
from ballast_asgi.gateway.compose import build_live, compose
from ballast_asgi.gateway.hooks import ServerHooks
from ballast_asgi.gateway.views import GatewayViews
from ballast_asgi.ops.admin import AdminRouter, Route, relative_path
from ballast_asgi.telemetry.events import emit
from ballast_asgi.telemetry.metrics import Metrics
from ballast_asgi.upstreams.core.instance import InstanceSpec


class Gateway(GatewayViews, ServerHooks):
    """The composed gateway: an ASGI app with admin endpoints, snapshot and reload."""

    def __init__(
        self,
        config: GatewayConfig,
        *,
        clock: Clock = time.monotonic,
        transport: httpx.AsyncBaseTransport | None = None,
        registry: CollectorRegistry | None = None,
        rng: random.Random | None = None,
        config_path: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
    ) -> None:
        if config.upstream is None and config.discovery is None:
            raise ConfigError("BALLAST_UPSTREAM: not set; the gateway needs an upstream URL")
        self.clock = clock
        self.metrics = Metrics(registry)
        self.rng = rng or random.Random()
        self.pieces = build_live(
            config, metrics=self.metrics, clock=clock, rng=self.rng, transport=transport,
            on_version=self._on_version,
        )  # fmt: skip
        self._source = (config_path, env, dict(overrides or {}))
        self.version = 1
        self.loaded_at = time.time()
        self._tasks: set[asyncio.Task[None]] = set()
        self.forwarded = ForwardedTrust(config.proxy.trusted_proxies)
        #: Whether the server may have rewritten ``scope["client"]`` (unknown: assume so).
        self.server_may_rewrite = True
        self._warned_rewrite = False
        self.draining = False
        self.worker = None
        #: ``workers.redivide_on_loss``: where the supervisor writes the live-worker count.
        self.share_path: str | None = None
        self.live = None
        self.stack = compose(config, self.pieces, self._traffic_admin)

    def _traffic_admin(self, stack: ASGIApp) -> AdminRouter:
        return self._admin(stack, "/_ballast", lambda: self.config.admin.on_traffic_port)

    def _on_version(self, instances: Sequence[Instance]) -> None:
        """A discovery version: swap the pool's instances, then rebuild the stack (the
        breakers' scale follows the instance count)."""
        before = len(self.pieces.pool.pool.instances) if self.pieces.pool else 0
        self.pieces.set_instances(instances)
        if len(instances) != before:
            config = self.config
            self.stack = compose(config, self.pieces, self._traffic_admin, previous=config)

    def _admin(self, app: ASGIApp | None, prefix: str, enabled: Any) -> AdminRouter:
        return AdminRouter(
            app,
            exposition=self.metrics.exposition,
            snapshot=self.snapshot,
            prefix=prefix,
            reload=self.reload_logged,
            token=lambda: self.config.admin.token,
            protect=lambda: self.config.admin.token_required,
            enabled=enabled,
            health=self.health,
            routes=self._canary_routes(),
        )

    def set_worker(self, index: int, of: int, share_path: str | None = None) -> None:
        """Mark this gateway as worker ``index`` of ``of`` (its config already scaled);
        ``share_path``: re-divide the caps when the supervisor says workers were lost."""
        self.worker = {"index": index, "of": of, "pid": os.getpid()} if of > 1 else None
        self.share_path = share_path if of > 1 else None

    async def redivide(self) -> tuple[bool, str] | None:
        """Divide the caps by the live-worker count the supervisor wrote (a reload);
        None when there is nothing new to apply."""
        live = read_live(self.share_path)
        if self.worker is None or live is None or live == (self.live or self.worker["of"]):
            return None
        previous, self.live = self.live, live
        ok, message = await self.reload()
        if not ok:
            self.live = previous
        index = self.worker["index"]
        emit("worker.caps_redivided", "info" if ok else "warning", key=str(index),
             worker=index, live=live, of=self.worker["of"], result=message)  # fmt: skip
        return ok, message

    def _canary_routes(self) -> dict[str, Route]:
        """``/canary`` and its actions (``state: none`` without a canary)."""
        return CanaryAdmin(self.canary, token=lambda: self.config.admin.token).routes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        stack = self.stack  # read once: a request finishes on the stack it started on
        if kind == "http":
            if self.server_may_rewrite or self.forwarded.networks:
                scope = self._peer(scope)  # else ``_peer`` returns the scope as it is
            prefix = stack.router.passing  # ``AdminRouter.passes`` inlined: its pass-through
            path = relative_path(scope) if scope.get("root_path") else scope["path"]
            if stack.direct is not None and prefix is not None and not path.startswith(prefix):
                await stack.direct(scope, receive, send)
                return
        elif kind == "websocket":
            await self.websockets(self._peer(scope), receive, send)
            return
        elif kind == "lifespan":
            self._handle_sighup()
            send = freeze_after_startup(send)
        await stack.app(scope, receive, send)

    def _peer(self, scope: Scope) -> Scope:
        """Keep ``client`` the direct peer; add the originating client for trusted proxies."""
        client = scope.get("client")
        peer = client[0] if client else None
        trusted = self.forwarded.is_trusted(peer)
        if not (trusted or self.server_may_rewrite):
            return scope  # nothing reads X-Forwarded-For: the header list is not walked
        entries = forwarded_entries(scope["headers"])
        if entries and self.server_may_rewrite and rewritten_by_server(client, entries):
            self._warn_rewrite()
            return {**scope, "client": None}
        if not trusted:
            return scope
        out = {**scope, CLIENT_IP_KEY: self.forwarded.client_ip(peer, entries)}
        scheme = self.forwarded.scheme(peer, scope["headers"])
        if scheme is not None:
            out["scheme"] = scheme if scope["type"] == "http" else scheme.replace("http", "ws")
        return out

    def _warn_rewrite(self) -> None:
        if not self._warned_rewrite:
            self._warned_rewrite = True
            print(
                "ballast: the server rewrote the client address from X-Forwarded-For; "
                "the direct peer is unknown and trusted for nothing. Run uvicorn with "
                "--no-proxy-headers and set proxy.trusted_proxies instead",
                file=sys.stderr,
            )

    def _handle_sighup(self) -> None:
        """Reload the config on SIGHUP (under uvicorn or the CLI, in the main thread)."""
        loop = asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, self._soon, loop, self.reload_logged)
            if self.share_path is not None:  # the supervisor lost a worker: re-divide
                loop.add_signal_handler(signal.SIGUSR1, self._soon, loop, self.redivide)
                self._soon(loop, self.redivide)  # a loss before this worker started
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
            return

    def _soon(self, loop: asyncio.AbstractEventLoop, work: Any) -> None:
        task = loop.create_task(work())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def reload_logged(self) -> tuple[bool, str]:
        """``reload`` plus one log line (SIGHUP and ``POST /_ballast/reload`` alike)."""
        ok, message = await self.reload()
        print(f"ballast: reload {'applied' if ok else 'rejected'}: {message}", file=sys.stderr)
        return ok, message

    def admin_app(self) -> AdminRouter:
        """The admin-port app: ``/metrics``, ``/snapshot``, ``/health`` at its root."""
        return self._admin(None, "", lambda: True)

    async def reload(self) -> tuple[bool, str]:
        """Re-read the config source and apply it without dropping any request."""
        path, env, overrides = self._source
        try:
            new = load_config(env=env, path=path, overrides=overrides)
            if self.worker is not None:
                new = scale_config(new, self.worker["of"], self.live)
            _check_reloadable(self.config, new, pooled=self.pool is not None)
            if new.discovery != self.config.discovery:
                raise ConfigError("discovery.* changes need a restart; nothing applied")
            if new.canary != self.config.canary:
                raise ConfigError("canary.* changes need a restart; nothing applied")
        except ConfigError as exc:
            self.metrics.config_reloads.labels("error").inc()
            return False, redact_userinfo(str(exc))
        pool = self.pieces.pool
        if pool is not None and self.discovery is None:  # with discovery: the version's list
            pool.set_instances([InstanceSpec(i.url, i.weight) for i in new.instances])
        self.stack = compose(new, self.pieces, self._traffic_admin, previous=self.config)
        self.version += 1
        self.loaded_at = time.time()
        self.metrics.config_reloads.labels("ok").inc()
        return True, f"config version {self.version} applied"


def _check_reloadable(old: GatewayConfig, new: GatewayConfig, *, pooled: bool) -> None:
    """Raise ConfigError for changes a reload cannot apply (a pool may change its instances)."""
    if new.proxy != old.proxy or new.upstreams != old.upstreams:
        raise ConfigError("proxy.* and upstreams.* changes need a restart; nothing applied")
    if pooled and len(new.instances) >= 2:
        return
    if new.upstream != old.upstream:
        raise ConfigError(
            "upstream changes need a restart unless the gateway runs a pool (a list of "
            "instances) and keeps one; nothing applied"
        )


#: Build the whole gateway from one config object (the composition root's entry point).
build_gateway = Gateway


def freeze_after_startup(send: Send) -> Send:
    """``send`` for the lifespan: ``gc.freeze()`` once start-up completed.

    Everything built at start-up (the config, the stages, the proxy, imported
    modules) moves to the permanent generation, so the cyclic collector no longer
    walks it on every full collection under load (about 1-2.5 % of the gateway's
    CPU in a profile, halved by this; issue 18).
    """

    async def lifespan_send(message: Message) -> None:
        if message["type"] == "lifespan.startup.complete":
            gc.freeze()
        await send(message)

    return lifespan_send
