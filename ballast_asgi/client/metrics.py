"""Prometheus metrics of ``BallastTransport`` calls, read at scrape time.

``ClientCollector`` turns the transports' integer counters and per-host state
into metric families when scraped (a call costs no metric update). The
``host`` label is bounded: the first ``metrics_max_hosts`` hosts a transport
sees are named, later ones share ``other``.

* ``ballast_client_calls_total{host, event}``: ``sent`` (attempts sent),
  ``retried``, ``retry_denied``, ``throttled`` (adaptive throttle),
  ``backed_off`` (Retry-After), ``no_budget`` (not sent: no budget left),
  ``shed`` (answered with a ballast shed or 429), ``failed`` (5xx gateway
  statuses, transport errors, deadline in flight);
* ``ballast_client_throttle_probability{host}``: the adaptive throttle's
  local reject probability now (the largest of the hosts sharing a label);
* ``ballast_client_retry_budget_balance{host}``: retries the host's budget
  still allows (the smallest of the hosts sharing a label);
* ``ballast_client_hosts``: host states held (bounded by ``max_hosts``).

``install()`` registers one collector over every live transport on the app's
registry; a transport built with ``registry=`` registers one over itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ballast_asgi.client.core.live import EVENTS, transports


class ClientCollector(Collector):
    """Metric families over the transports ``source`` returns (default: every live one)."""

    def __init__(self, source: Callable[[], Iterable[Any]] = transports) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        calls = CounterMetricFamily(
            "ballast_client_calls", "Outgoing calls by host and event.", labels=["host", "event"]
        )
        prob = GaugeMetricFamily(
            "ballast_client_throttle_probability",
            "Adaptive throttle's local reject probability.", labels=["host"],
        )  # fmt: skip
        balance = GaugeMetricFamily(
            "ballast_client_retry_budget_balance",
            "Retries the host's retry budget still allows.", labels=["host"],
        )  # fmt: skip
        held = 0
        counts: dict[str, dict[str, int]] = {}
        probs: dict[str, float] = {}
        balances: dict[str, float] = {}
        for transport in self._source():
            now = transport.clock()
            held += len(transport.hosts)
            for label, c in transport.hosts.labels.items():
                row = counts.setdefault(label, dict.fromkeys(EVENTS, 0))
                for event, value in c.as_dict().items():
                    row[event] += value
            for _, state in transport.hosts.items():
                probs[state.label] = max(
                    probs.get(state.label, 0.0), state.throttle.reject_probability(now)
                )
                b = state.budget.balance(now)
                balances[state.label] = min(balances.get(state.label, b), b)
        for label, row in counts.items():
            for event, value in row.items():
                calls.add_metric([label, event], value)
        for label, p in probs.items():
            prob.add_metric([label], p)
        for label, b in balances.items():
            balance.add_metric([label], b)
        hosts = GaugeMetricFamily("ballast_client_hosts", "Upstream host states held.")
        hosts.add_metric([], held)
        yield from (calls, prob, balance, hosts)
