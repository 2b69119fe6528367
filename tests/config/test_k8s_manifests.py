"""deploy/k8s validates offline against the Kubernetes schemas and matches the gateway config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ballast_asgi.config import build_config

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
#: The Kubernetes version whose schemas the manifests must satisfy (strict: no unknown fields).
VERSION = "1.30"


def _docs() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return docs


def _kind(kind: str) -> dict[str, Any]:
    return next(d for d in _docs() if d["kind"] == kind)


@pytest.mark.parametrize("doc", _docs(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_is_valid_for_kubernetes(doc: dict[str, Any]) -> None:
    """Each manifest passes the official schema, strictly (offline, kubernetes-validate)."""
    kubernetes_validate.validate(doc, VERSION, strict=True)


def test_every_required_kind_is_there() -> None:
    """Deployment, Service, ConfigMap, PodDisruptionBudget and an HPA."""
    kinds = {d["kind"] for d in _docs()}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    assert "HorizontalPodAutoscaler" in kinds


def test_configmap_holds_a_valid_gateway_config() -> None:
    """The ConfigMap's ballast.yaml loads with the gateway's own validation."""
    data = yaml.safe_load(_kind("ConfigMap")["data"]["ballast.yaml"])
    config = build_config(data)
    assert config.priority.trust_header is False and not config.admin.on_traffic_port


def test_grace_period_covers_the_drain() -> None:
    """terminationGracePeriodSeconds exceeds drain grace plus shutdown timeout."""
    server = build_config(yaml.safe_load(_kind("ConfigMap")["data"]["ballast.yaml"])).server
    spec = _kind("Deployment")["spec"]["template"]["spec"]
    needed_s = (server.drain_grace_ms + server.shutdown_timeout_ms) / 1000.0
    assert spec["terminationGracePeriodSeconds"] > needed_s


def test_pod_runs_unprivileged_with_probes_on_health() -> None:
    """Non-root, read-only root filesystem, no privilege escalation; readiness on /health."""
    pod = _kind("Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "livenessProbe" in container and container["resources"]["limits"]
