"""Active health checks: an async driver that probes every instance off the request path.

One task per instance: wait a random share of the interval (so instances and
gateways do not probe in step), then forever: ``GET <instance url><path>``
with the probe timeout, hand the result to the pool (``Pool.record_probe``),
sleep ``HealthPolicy.next_delay_s`` (the interval +/- jitter). ``sync()``
starts tasks for new instances and stops those of removed ones (reload,
discovery). The HTTP call is injected (``Probe``) so tests drive the loop with
a fake probe and a fake sleep; the default uses its own small httpx client,
separate from the proxy's connection pool, so a probe never waits behind
traffic for a connection.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import httpx

from ballast_asgi.upstreams.core.instance import Instance
from ballast_asgi.upstreams.core.pool import Pool

#: ``probe(url, timeout_s) -> (passed, error)``; must not raise for HTTP failures.
Probe = Callable[[str, float], Awaitable[tuple[bool, str | None]]]
Sleep = Callable[[float], Awaitable[None]]
#: Called after a probe changed an instance's health: (instance, healthy).
OnChange = Callable[[Instance, bool], None]


class HttpProbe:
    """The default probe: GET over a dedicated httpx client; ``passes(status)`` decides."""

    def __init__(self, passes: Callable[[int], bool] = lambda s: 200 <= s < 400) -> None:
        self._passes = passes
        self._client = httpx.AsyncClient(
            trust_env=False,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
        )

    async def __call__(self, url: str, timeout_s: float) -> tuple[bool, str | None]:
        try:
            response = await self._client.get(url, timeout=timeout_s)
        except httpx.TimeoutException:
            return False, "timeout"
        except httpx.HTTPError as exc:
            return False, type(exc).__name__
        if self._passes(response.status_code):
            return True, None
        return False, f"status {response.status_code}"

    async def aclose(self) -> None:
        await self._client.aclose()


class HealthChecker:
    """Probes each instance of ``pool`` on its own jittered schedule."""

    def __init__(
        self,
        pool: Pool,
        *,
        probe: Probe | None = None,
        rng: random.Random | None = None,
        sleep: Sleep = asyncio.sleep,
        on_change: OnChange | None = None,
    ) -> None:
        self.pool = pool
        self._own_probe = HttpProbe(pool.policy.health.passes) if probe is None else None
        self._probe: Probe = probe if probe is not None else self._own_probe  # type: ignore[assignment]
        self._rng = rng if rng is not None else random.Random()
        self._sleep = sleep
        self._on_change = on_change
        self._tasks: dict[Instance, asyncio.Task[None]] = {}

    @property
    def started(self) -> bool:
        """Whether ``sync`` has started probing (and ``aclose`` has not stopped it)."""
        return bool(self._tasks)

    @property
    def running(self) -> int:
        """Probe tasks alive."""
        return sum(1 for t in self._tasks.values() if not t.done())

    def sync(self) -> None:
        """Start probing new instances, stop probing removed ones (needs a running loop)."""
        if not self.pool.policy.health.enabled:
            return
        live = set(self.pool.instances)
        for inst in list(self._tasks):
            if inst not in live:
                self._tasks.pop(inst).cancel()
        for inst in live:
            if inst not in self._tasks:
                self._tasks[inst] = asyncio.get_running_loop().create_task(self._run(inst))

    async def aclose(self) -> None:
        """Stop every probe task and close the probe's client."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._own_probe is not None:
            await self._own_probe.aclose()

    async def _run(self, inst: Instance) -> None:
        policy = self.pool.policy.health
        await self._sleep(self._rng.random() * policy.interval_ms / 1000.0)
        while not inst.removed:
            await self.probe_once(inst)
            await self._sleep(policy.next_delay_s(self._rng))

    async def probe_once(self, inst: Instance) -> bool:
        """Probe one instance now and record the result; True when it passed."""
        policy = self.pool.policy.health
        passed, error = await self._probe(inst.url + policy.path, policy.timeout_ms / 1000.0)
        if self.pool.record_probe(inst, passed, error) and self._on_change is not None:
            self._on_change(inst, inst.health.healthy)
        return passed
