"""The docker compose demo file is valid (checked with Debian's docker-compose when present)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


def test_compose_file_validates() -> None:
    """`docker-compose config -q` accepts docker-compose.yml."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (Debian: apt-get install docker-compose)")
    proc = subprocess.run(
        [exe, "-f", str(COMPOSE), "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_compose_services_and_prometheus_config_exist() -> None:
    """The compose file names the four services and the Prometheus config it mounts."""
    text = COMPOSE.read_text()
    for service in ("upstream:", "gateway:", "load:", "prometheus:"):
        assert f"\n  {service}" in text
    assert (ROOT / "deploy" / "prometheus.yml").is_file()


def test_dockerfile_uses_the_readme_build_steps() -> None:
    """The image is python:3.11-slim with `pip install .`."""
    text = (ROOT / "Dockerfile").read_text()
    assert "FROM python:3.11-slim" in text
    assert "pip install --no-cache-dir ." in text
