"""Discovery's Prometheus series, read from the runtime at scrape time (no per-request cost).

* ``ballast_discovery_config_version``: the config version applied (0 before the first);
* ``ballast_discovery_applied_timestamp_seconds``: when it was applied (unix seconds);
* ``ballast_discovery_instances``: instances in the applied version;
* ``ballast_discovery_etcd_connected``: 1 while the follower's watch is up;
* ``ballast_discovery_rejected_versions_total``: versions not applied (malformed, empty);
* ``ballast_discovery_leader``: 1 while this gateway's controller is elected;
* ``ballast_discovery_versions_written_total``: versions this gateway's controller wrote.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ballast_asgi.discovery.runtime import DiscoveryRuntime


class DiscoveryCollector(Collector):
    """Yields the discovery series from a ``DiscoveryRuntime``."""

    def __init__(self, runtime: DiscoveryRuntime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        """One sample per series."""
        follower, controller = self.runtime.follower, self.runtime.controller
        current = follower.current
        yield _gauge("config_version", "Config version applied", current.number if current else 0)
        yield _gauge("applied_timestamp_seconds", "When it was applied", follower.applied_at or 0)
        yield _gauge("instances", "Instances applied", len(current.instances) if current else 0)
        yield _gauge("etcd_connected", "Follower connected to etcd", int(follower.connected))
        rejected = CounterMetricFamily(
            "ballast_discovery_rejected_versions", "Versions not applied", value=follower.rejected
        )
        yield rejected
        yield _gauge("leader", "This gateway's controller is elected",
                     int(controller is not None and controller.is_leader))  # fmt: skip
        written = controller.written if controller is not None else 0
        yield CounterMetricFamily(
            "ballast_discovery_versions_written", "Versions written here", value=written
        )


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"ballast_discovery_{name}", doc, value=value)


def register(registry: CollectorRegistry, runtime: DiscoveryRuntime) -> None:
    """Add the discovery series to ``registry``."""
    registry.register(DiscoveryCollector(runtime))
