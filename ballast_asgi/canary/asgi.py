"""The canary at the ASGI edge: the runtime, the response header and the admin routes.

``CanaryRuntime`` builds the pieces from ``CanaryConfig`` around the stable
selector. ``CanaryMiddleware`` sits right outside the proxy: it gives each
attempt an ``Assignment`` (the sticky key and the resolved client address,
the key of the per-client evidence budget) through a context variable and,
with ``canary.version_header`` (default on), adds
``X-Ballast-Version: stable|canary`` to the response head of the version
that served it. ``CanaryAdmin`` gives the ``AdminRouter`` its routes
(so ``admin.on_traffic_port`` and ``admin.token_required`` apply):
``GET {prefix}/canary`` (always; ``state: none`` without a canary) and
``POST {prefix}/canary/promote`` and ``.../rollback`` behind the admin bearer
token (404 while no token is configured, like reload; 401 for a wrong one).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ballast_asgi.canary.core.blocks import LatencyBaseline, Version
from ballast_asgi.canary.core.clients import ClientBudget
from ballast_asgi.canary.core.history import StableHistory
from ballast_asgi.canary.core.judges import FixedHorizonJudge, SequentialJudge, make_judge
from ballast_asgi.canary.core.rollout import RampPlan, Rollout, State
from ballast_asgi.canary.core.split import Split
from ballast_asgi.canary.log import announce
from ballast_asgi.canary.pool import canary_urls
from ballast_asgi.canary.selector import ASSIGNMENT, CanarySelector
from ballast_asgi.config.models import CanaryConfig
from ballast_asgi.core.forwarded import client_ip
from ballast_asgi.core.types import ASGIApp, Clock, Message, Receive, Scope, Send
from ballast_asgi.middleware.responses import send_json
from ballast_asgi.ops.admin import Route, _allow, _authorized
from ballast_asgi.proxy.upstream import Selector, SingleUpstream, Upstream
from ballast_asgi.telemetry.metrics import LATENCY_BUCKETS

TokenFn = Callable[[], "str | None"]
_HEADER = b"x-ballast-version"


class CanaryRuntime:
    """One configured canary: rollout, split, selector and per-version metrics."""

    def __init__(
        self,
        config: CanaryConfig,
        stable: Selector,
        *,
        registry: CollectorRegistry,
        clock: Clock = time.monotonic,
        rng: random.Random | None = None,
        canary: Selector | None = None,
    ) -> None:
        """``canary``: the canary side's selector (a pool for several URLs, built by the
        composition, ``gateway.pools.canary_selector``); None: the first URL alone."""
        urls = canary_urls(config.upstream)
        if not urls:
            raise ValueError("canary.upstream is required for a canary")
        self.config = config
        self.clock = clock
        seq = config.sequential
        learn = config.rule == "sequential" and seq.history.enabled
        #: The stable instances' history (the warm start); recorded before and during the canary.
        self.history = StableHistory(seq.history.params(), clock()) if learn else None
        judge = make_judge(config.rule, alpha=config.alpha, horizon_s=config.horizon_ms / 1000,
                           error_share=seq.error_share, params=seq.params(),
                           history=self.history,
                           calm_cap_nats=seq.history.calm_cap_nats)  # fmt: skip
        plan = RampPlan(config.ramp.steps, config.ramp.step_ms / 1000, config.ramp.min_requests)
        baseline = LatencyBaseline(quantile=config.latency_quantile)
        self.rollout = Rollout(judge, now=clock(), weight=config.weight, plan=plan,
                               baseline=baseline)  # fmt: skip
        salt = config.salt.get_secret_value() if config.salt is not None else None
        split = Split(sticky_header=config.sticky_header, sticky_cookie=config.sticky_cookie,
                      salt=salt, use_request_id=config.sticky_request_id,
                      signed_cookie=config.signed_cookie, rng=rng)  # fmt: skip
        if canary is None:
            canary = SingleUpstream(Upstream.parse(urls[0]))
        #: One client's judged outcomes per block are capped (docs/canary.md, threat model).
        self.budget = ClientBudget(config.max_outcomes_per_client, max_clients=config.max_clients)
        self.selector = CanarySelector(stable, canary, self.rollout, split, clock=clock,
                                       on_record=self._count, history=self.history,
                                       budget=self.budget)  # fmt: skip
        self._metrics(registry)

    def _metrics(self, r: CollectorRegistry) -> None:
        self.requests = Counter("ballast_canary_requests", "Attempts the canary judge counted.",
                                ["version", "result"], registry=r)  # fmt: skip
        self.latency = Histogram("ballast_canary_latency_seconds", "Time to response head.",
                                 ["version"], buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        Gauge("ballast_canary_weight", "Canary share of new requests.",
              registry=r).set_function(lambda: self.rollout.weight)  # fmt: skip
        state = Gauge("ballast_canary_state", "1 for the canary's current state.", ["state"],
                      registry=r)  # fmt: skip
        for s in State:
            state.labels(s.value).set_function(self._is_state(s))
        Gauge("ballast_canary_client_capped", "Outcomes not judged: their client's cap was used.",
              registry=r).set_function(lambda: self.budget.dropped)  # fmt: skip
        judge = self.rollout.judge
        if isinstance(judge, SequentialJudge):
            e = Gauge("ballast_canary_log_e_value", "The sequential judge's log e-value.",
                      ["metric"], registry=r)  # fmt: skip
            e.labels("errors").set_function(lambda: judge.errors.log_e)
            e.labels("latency").set_function(lambda: judge.latency.log_e)

    def _is_state(self, state: State) -> Callable[[], float]:
        return lambda: float(self.rollout.state is state)

    def _count(self, version: Version, failed: bool, latency_s: float | None) -> None:
        self.requests.labels(version.value, "error" if failed else "ok").inc()
        if latency_s is not None:
            self.latency.labels(version.value).observe(latency_s)

    def snapshot(self) -> dict[str, Any]:
        """``GET /_ballast/canary``: state, weight, counts, statistic, decision."""
        now = self.clock()
        running = self.rollout.state is State.RUNNING
        self.rollout.tick(now)
        if running and self.rollout.state is not State.RUNNING:
            announce(self.rollout)
        doc = self.rollout.snapshot(now)
        shown = [u.display for u in self.selector.canary.upstreams()]
        doc["upstream"] = shown[0] if shown else None
        doc["upstreams"] = shown
        doc["client_capped"] = self.budget.dropped
        judge = self.rollout.judge
        if isinstance(judge, FixedHorizonJudge):
            doc["horizon_s"] = judge.horizon_s
        return doc


class CanaryMiddleware:
    """Gives each attempt its sticky key and client; labels the response with the version.

    With ``cookie`` (``canary.signed_cookie``) a response to a request that had
    no valid signed cookie sets one (``Path=/; HttpOnly; SameSite=Lax``,
    ``Secure`` over https, ``Max-Age`` = ``cookie_max_age_s``).
    """

    def __init__(
        self,
        app: ASGIApp,
        selector: CanarySelector,
        *,
        header: bool = True,
        cookie: str | None = None,
        cookie_max_age_s: int = 86_400,
    ) -> None:
        self.app = app
        self.selector = selector
        self.header = header
        self._cookie = f"{cookie}=%s; Path=/; Max-Age={cookie_max_age_s}; HttpOnly; SameSite=Lax"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        assignment = self.selector.assign(scope["headers"], client_ip(scope))
        token = ASSIGNMENT.set(assignment)
        if not self.header and assignment.issue is None:
            try:
                await self.app(scope, receive, send)
            finally:
                ASSIGNMENT.reset(token)
            return

        async def labelled(message: Message) -> None:
            if message["type"] == "http.response.start" and assignment.version is not None:
                headers = list(message.get("headers", ()))
                if self.header:
                    headers.append((_HEADER, self.selector.label(assignment.version).encode()))
                if assignment.issue is not None:
                    cookie = self._cookie % assignment.issue.decode()
                    secure = "; Secure" if scope.get("scheme") == "https" else ""
                    headers.append((b"set-cookie", (cookie + secure).encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, labelled)
        finally:
            ASSIGNMENT.reset(token)


class CanaryAdmin:
    """The admin routes: ``/canary`` (GET) and ``/canary/{promote,rollback}`` (POST, token)."""

    def __init__(self, runtime: CanaryRuntime | None, *, token: TokenFn) -> None:
        self.runtime = runtime
        self._token = token

    def routes(self) -> dict[str, Route]:
        """Route names under the admin prefix, for ``AdminRouter(routes=...)``."""
        return {"/canary": self._show, "/canary/promote": self._promote,
                "/canary/rollback": self._rollback}  # fmt: skip

    async def _show(self, scope: Scope, receive: Receive, send: Send) -> None:
        if await _allow(scope, send, ("GET", "HEAD")):
            await send_json(send, 200, self._doc())

    async def _promote(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._act(scope, send, "promote")

    async def _rollback(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._act(scope, send, "rollback")

    def _doc(self) -> dict[str, Any]:
        if self.runtime is None:
            return {"state": State.NONE.value, "weight": 0.0}
        return self.runtime.snapshot()

    async def _act(self, scope: Scope, send: Send, action: str) -> None:
        token = self._token()
        if not token:
            message = "canary actions are disabled: no admin token"
            await send_json(send, 404, {"error": "not_found", "message": message})
            return
        if not await _allow(scope, send, ("POST",)):
            return
        if not _authorized(scope, token):
            await send_json(send, 401, {"error": "unauthorized", "message": "bad admin token"})
            return
        if self.runtime is None:
            await send_json(send, 409, {"error": "no_canary", "message": "no canary configured"})
            return
        rollout, now = self.runtime.rollout, self.runtime.clock()
        if rollout.state is not State.RUNNING:
            await send_json(send, 409, {"error": "already_decided", **self._doc()})
            return
        _ = rollout.promote(now) if action == "promote" else rollout.rollback(now)
        announce(rollout)
        await send_json(send, 200, self._doc())


__all__ = ["CanaryAdmin", "CanaryMiddleware", "CanaryRuntime"]
