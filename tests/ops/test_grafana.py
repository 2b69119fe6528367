"""The Grafana dashboard asks only for metrics a live gateway exports (names and labels)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from ballast_asgi.config import build_config
from ballast_asgi.gateway import build_gateway

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
_NAME = re.compile(r"\bballast_[a-z0-9_]+")
_BY = re.compile(r"\bby \(([^)]*)\)")


def _exprs() -> list[str]:
    doc = json.loads((GRAFANA / "dashboards" / "ballast.json").read_text())
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


async def _live_samples() -> dict[str, set[str]]:
    """Sample name -> label names, from /_ballast/metrics of a gateway that served a request."""
    gw = build_gateway(build_config({"upstream": "http://up.test"}), env={},
                       transport=httpx.MockTransport(lambda r: httpx.Response(200)))  # fmt: skip
    async with httpx.AsyncClient(transport=httpx.ASGITransport(gw), base_url="http://gw") as c:
        await c.get("/x")
        text = (await c.get("/_ballast/metrics")).text
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


@pytest.mark.anyio
async def test_every_promql_metric_and_label_exists() -> None:
    """Each metric name in every panel's PromQL is exported, with the labels it groups by."""
    live = await _live_samples()
    exprs = _exprs()
    assert len(exprs) >= 8
    for expr in exprs:
        names = _NAME.findall(expr)
        assert names, expr
        for name in names:
            assert name in live, f"{name} (in {expr!r}) is not exported"
            for group in _BY.findall(expr):
                labels = {x.strip() for x in group.split(",")} - {"le"}
                assert labels <= live[name], f"{name} lacks labels {labels - live[name]}"


def test_provisioning_points_at_the_compose_prometheus() -> None:
    """The datasource is the compose Prometheus; the dashboard uses that datasource."""
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    source = ds["datasources"][0]
    assert source["url"] == "http://prometheus:9090"
    doc = json.loads((GRAFANA / "dashboards" / "ballast.json").read_text())
    assert {p["datasource"]["uid"] for p in doc["panels"]} == {source["uid"]}
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "grafana/grafana" in compose and "./deploy/grafana/dashboards" in compose
