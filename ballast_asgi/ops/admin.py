"""Admin endpoints: Prometheus metrics, a JSON snapshot, health, and reload.

``AdminRouter`` sits outside every shedding stage, so a scrape succeeds at any
overload: it answers ``{prefix}/metrics``, ``{prefix}/snapshot``,
``{prefix}/health`` and ``POST {prefix}/reload`` itself and passes everything
else to the wrapped app. With ``app=None`` and ``prefix=""`` it is the
standalone admin-port app (``/metrics`` and ``/snapshot`` at its root).

``POST reload`` is disabled (404) unless an admin token is configured, and then
requires ``Authorization: Bearer <token>`` (the scheme is case-insensitive).
With ``protect`` returning true, every path except ``health`` needs the token
too (401 with ``WWW-Authenticate: Bearer`` otherwise).

Paths are matched relative to ``scope["root_path"]``: under ``uvicorn
--root-path /gw`` or a Starlette ``Mount("/sub", ...)`` the health check is
``/gw/_ballast/health`` / ``/sub/_ballast/health``.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from ballast_asgi.core.types import ASGIApp, Receive, Scope, Send
from ballast_asgi.middleware.responses import send_json

SnapshotFn = Callable[[], dict[str, Any]]
#: Reload hook: returns (ok, message). Receives nothing; re-reads the config source.
ReloadFn = Callable[[], Awaitable[tuple[bool, str]]]
TokenFn = Callable[[], str | None]
FlagFn = Callable[[], bool]
#: Health hook: (status, JSON body); 503 ``draining`` during a graceful shutdown.
HealthFn = Callable[[], tuple[int, dict[str, Any]]]
Route = Callable[[Scope, Receive, Send], Awaitable[None]]
#: Paths served without the token even when ``protect`` is on (load-balancer probes).
_OPEN = frozenset({"/health", "/dashboard", ""})


class AdminRouter:
    """Serve the admin paths; pass every other request to ``app``."""

    def __init__(
        self,
        app: ASGIApp | None,
        *,
        exposition: Callable[[], bytes],
        snapshot: SnapshotFn,
        prefix: str = "/_ballast",
        reload: ReloadFn | None = None,
        token: TokenFn = lambda: None,
        protect: FlagFn = lambda: False,
        enabled: FlagFn = lambda: True,
        health: HealthFn = lambda: (200, {"status": "ok"}),
        routes: Mapping[str, Route] | None = None,
    ) -> None:
        if prefix and (not prefix.startswith("/") or prefix.endswith("/")):
            raise ValueError(f"admin prefix must start and not end with '/', got {prefix!r}")
        self.app = app
        self._exposition = exposition
        self._snapshot = snapshot
        self._reload = reload
        self._token = token
        self._protect = protect
        self._enabled = enabled
        self._health_state = health
        self._prefix = prefix
        #: The prefix a request's path must not start with to pass (``passes``); None:
        #: nothing passes (no app, or the admin port's router at the root).
        self.passing: str | None = prefix if app is not None and prefix else None
        self._routes: dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            f"{prefix}/metrics": self._metrics,
            f"{prefix}/snapshot": self._snapshot_json,
            f"{prefix}/health": self._health,
            f"{prefix}/reload": self._reload_route,
            f"{prefix}/dashboard": self._dashboard,
        }
        if not prefix:  # the admin port: the dashboard at its root too
            self._routes["/"] = self._dashboard
        #: More routes by name under the prefix (e.g. ``/canary``), from other capabilities.
        self._routes.update({f"{prefix}{name}": route for name, route in (routes or {}).items()})

    def passes(self, scope: Scope) -> bool:
        """Whether an HTTP request goes to ``app`` untouched (its path is not under the prefix).

        A composition root may then call ``app`` itself (``Gateway`` does).
        """
        prefix = self.passing
        return prefix is not None and not relative_path(scope).startswith(prefix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = relative_path(scope)
            if self._prefix == "" or path.startswith(self._prefix):
                route = self._routes.get(path.rstrip("/") or path)
                if route is not None and not self._enabled():
                    await send_json(send, 404, {"error": "not_found", "path": path})
                    return
                if route is not None:
                    if await self._guard(scope, send, path):
                        await route(scope, receive, send)
                    return
                if self.app is None or path == self._prefix or path[len(self._prefix)] == "/":
                    await send_json(send, 404, {"error": "not_found", "path": path})
                    return
        elif scope["type"] == "lifespan" and self.app is None:
            await empty_lifespan(receive, send)
            return
        if self.app is None:
            await send_json(send, 404, {"error": "not_found"})
            return
        await self.app(scope, receive, send)

    async def _guard(self, scope: Scope, send: Send, path: str) -> bool:
        """False (after a 401) when the token is required and missing or wrong."""
        name = path.rstrip("/")[len(self._prefix) :]
        if name in _OPEN or name == "/reload":
            return True
        token = self._token()
        if not self._protect() or not token or _authorized(scope, token):
            return True
        challenge = [(b"www-authenticate", b"Bearer")]
        await send_json(
            send, 401, {"error": "unauthorized", "message": "admin token required"}, challenge
        )
        return False

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not await _allow(scope, send, ("GET", "HEAD")):
            return
        body = self._exposition()
        headers = [
            (b"content-type", CONTENT_TYPE_LATEST.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )

    async def _snapshot_json(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await _allow(scope, send, ("GET", "HEAD")):
            await send_json(send, 200, self._snapshot())

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await _allow(scope, send, ("GET", "HEAD")):
            status, body = self._health_state()
            await send_json(send, status, body)

    async def _dashboard(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The live dashboard page: static, self-contained; its data comes from ``snapshot``."""
        if not await _allow(scope, send, ("GET", "HEAD")):
            return
        body = dashboard_html()
        headers = [
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"),
            (b"content-security-policy", dashboard_csp()),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send(
            {"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body}
        )

    async def _reload_route(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = self._token()
        if self._reload is None or not token:
            await send_json(
                send, 404, {"error": "not_found", "message": "reload is disabled: no admin token"}
            )
            return
        if not await _allow(scope, send, ("POST",)):
            return
        if not _authorized(scope, token):
            await send_json(send, 401, {"error": "unauthorized", "message": "bad admin token"})
            return
        ok, message = await self._reload()
        status = 200 if ok else 422
        await send_json(send, status, {"reloaded": ok, "message": message})


async def _allow(scope: Scope, send: Send, methods: tuple[str, ...]) -> bool:
    if scope["method"] in methods:
        return True
    allow = (b"allow", ", ".join(methods).encode())
    await send_json(send, 405, {"error": "method_not_allowed"}, [allow])
    return False


@functools.cache
def dashboard_html() -> bytes:
    """``static/dashboard.html`` (read once)."""
    return resources.files("ballast_asgi").joinpath("static/dashboard.html").read_bytes()


@functools.cache
def dashboard_csp() -> bytes:
    """The dashboard's Content-Security-Policy: its own inline script and style by hash.

    No ``'unsafe-inline'``: only the exact ``<script>`` and ``<style>`` of
    ``dashboard.html`` run (their SHA-256, computed from the file, so an edit of
    the page keeps its policy true); an injected script or style attribute
    does not. The page may only talk to where it came from (no CDN, no
    external fetch), cannot be framed, has no base or form target.
    """
    page = dashboard_html().decode("utf-8")
    scripts = " ".join(_hashes(page, "script"))
    styles = " ".join(_hashes(page, "style"))
    return (
        f"default-src 'none'; script-src {scripts}; style-src {styles}; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ).encode("ascii")


def _hashes(page: str, tag: str) -> list[str]:
    """CSP source expressions for every inline ``<tag>`` element's text in ``page``."""
    found = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.DOTALL)
    if not found:
        raise RuntimeError(f"dashboard.html has no inline <{tag}>")
    digests = (hashlib.sha256(text.encode("utf-8")).digest() for text in found)
    return [f"'sha256-{base64.b64encode(d).decode('ascii')}'" for d in digests]


def relative_path(scope: Scope) -> str:
    """The path without the mount prefix (``root_path``) when it carries one."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if not root:
        return path
    if path.startswith(root) and path[len(root) : len(root) + 1] in ("/", ""):
        return path[len(root) :] or "/"
    return path


def _authorized(scope: Scope, token: str) -> bool:
    """``Authorization: Bearer <token>``; the scheme is case-insensitive (RFC 9110 11.1)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, given = value.strip().partition(b" ")
            if scheme.lower() != b"bearer":
                return False
            return hmac.compare_digest(given.strip(), token.encode())
    return False


async def empty_lifespan(receive: Receive, send: Send) -> None:
    """Answer a lifespan scope for an app that has nothing to start or stop."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
