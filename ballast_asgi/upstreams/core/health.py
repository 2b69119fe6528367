"""Active health: what a run of probe results means (pure).

States::

    healthy --unhealthy_threshold failed probes in a row--> unhealthy
    unhealthy --healthy_threshold passed probes in a row--> healthy

An instance starts healthy (the gateway serves at once; the first failed
probes take it out), and a passed probe resets the failure run and vice
versa. What passes is ``expect``:

* ``below_500`` (the default): any HTTP answer below 500 within the probe
  timeout: the process is up and serving. An app without a health endpoint
  answers its 404 and stays in; a 5xx, a refused connection, a reset or a
  timeout fail. Without this default, ``BALLAST_UPSTREAM=a,b,c`` in front of an
  app that has no ``/health`` marked every instance unhealthy, kept the pool
  in panic mode for ever and so disabled failover (issue 30);
* ``2xx``: only a 2xx or 3xx passes, for apps whose health endpoint answers
  503 when they are not ready (set it with the path of that endpoint).

Every instance failing its probes is reported (event
``pool.all_failing_probes``, ``/snapshot``'s ``pool.warnings``, health
``degraded``): that is nearly always a wrong path or expectation.

When probes run is the driver's business
(``checker.py``): every ``interval_ms``, each instance on its own schedule,
with the next delay jittered by ``+/- jitter`` (a share of the interval) from
an injected ``random.Random``, so a fleet of gateways does not probe in step.
Defaults: 3 failures out, 2 passes back in (Envoy: ``unhealthy_threshold``,
``healthy_threshold``), interval 500 ms, timeout 1 s, jitter 0.1. Three
failures, not two: with 1 % random errors two failed probes in a row happen
about once in 10,000 probes (a false ejection every few minutes over a few
instances), three about once in a million.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

Expect = Literal["below_500", "2xx"]


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """Active health-check settings."""

    enabled: bool = True
    path: str = "/health"
    interval_ms: int = 500
    timeout_ms: int = 1_000
    healthy_threshold: int = 2
    unhealthy_threshold: int = 3
    jitter: float = 0.1
    expect: Expect = "below_500"

    def passes(self, status: int) -> bool:
        """Whether a probe answered with ``status`` passes (see ``expect``)."""
        if self.expect == "2xx":
            return 200 <= status < 400
        return status < 500

    def next_delay_s(self, rng: random.Random) -> float:
        """Seconds until an instance's next probe: the interval, jittered."""
        base = self.interval_ms / 1000.0
        return base * (1.0 + self.jitter * (2.0 * rng.random() - 1.0))


class HealthState:
    """One instance's probe record."""

    __slots__ = ("_fails", "_passes", "healthy", "last_error", "probes")

    def __init__(self) -> None:
        self.healthy = True
        self._passes = 0
        self._fails = 0
        self.probes = 0
        self.last_error: str | None = None

    def record(self, passed: bool, policy: HealthPolicy, error: str | None = None) -> bool:
        """Take one probe result; True when it changed ``healthy``."""
        self.probes += 1
        if passed:
            self._passes += 1
            self._fails = 0
            self.last_error = None
            if not self.healthy and self._passes >= policy.healthy_threshold:
                self.healthy = True
                return True
            return False
        self._fails += 1
        self._passes = 0
        self.last_error = error
        if self.healthy and self._fails >= policy.unhealthy_threshold:
            self.healthy = False
            return True
        return False
