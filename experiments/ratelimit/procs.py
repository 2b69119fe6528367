"""Processes of one experiment: the upstream and gateway pairs (on ``_harness`` Procs).

Every process is started and stopped by PID through ``experiments._harness.procs``;
their output goes to ``<workdir>/<name>.log``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from experiments._harness.cpu import cpu_s
from experiments._harness.procs import HOST, Procs, free_port, wait_port

#: The gateway reads only its file: a stray variable of the caller's shell must not leak in.
_CLEAN_ENV = {"BALLAST_UPSTREAM": "", "BALLAST_LIMITER": "", "BALLAST_FIXED_LIMIT": "",
              "BALLAST_REDIS_URL": ""}  # fmt: skip


def _get(url: str, timeout: float = 1.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def _uvicorn(app: str, port: int) -> list[str]:
    return [sys.executable, "-m", "uvicorn", app, "--host", HOST, "--port", str(port),
            "--log-level", "warning", "--no-access-log"]  # fmt: skip


def upstream(procs: Procs) -> str:
    """Start the trivial upstream in its own uvicorn process; its base URL."""
    port = free_port()
    procs.start(_uvicorn("experiments.ratelimit.upstream:app", port), None, port, "upstream")
    return f"http://{HOST}:{port}"


class Pair:
    """Two gateway processes with the same config."""

    def __init__(self, name: str, ports: list[int], procs: list[subprocess.Popen[bytes]]) -> None:
        self.name = name
        self.bases = [f"http://{HOST}:{p}" for p in ports]
        self.ports = ports
        self.procs = procs

    def snapshots(self) -> list[dict[str, Any]]:
        """Each gateway's ``rate_limit`` snapshot (None when disabled)."""
        return [json.loads(_get(b + "/_ballast/snapshot", 5.0))["rate_limit"] for b in self.bases]

    def cpu(self) -> float:
        """CPU seconds used by both gateways so far."""
        return sum(cpu_s(p.pid) for p in self.procs)


def gateway_config(upstream_url: str, section: dict[str, Any] | None) -> dict[str, Any]:
    """A gateway whose only shedding stage that can act is the rate limit."""
    doc: dict[str, Any] = {
        "upstream": upstream_url,
        "max_concurrent_requests": 5000,
        "breaker": {"enabled": False},
        "retry": {"enabled": False},
    }
    if section is not None:
        doc["rate_limit"] = {"enabled": True, "key": "header:X-Tenant", **section}
    return doc


@contextmanager
def pairs(
    configs: dict[str, dict[str, Any]],
    procs: Procs,
    workdir: Path,
    app: str = "ballast_asgi.gateway:app",
) -> Iterator[dict[str, Pair]]:
    """Start every pair at once, wait until all listen, stop them all (by PID) at the end."""
    started: dict[str, Pair] = {}
    try:
        for name, doc in configs.items():
            path = workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(doc))
            env = {**_CLEAN_ENV, "BALLAST_CONFIG": str(path)}
            ports = [free_port(), free_port()]
            cmds = [_uvicorn(app, port) for port in ports]
            logs = [f"gw-{name}-{i}" for i in range(len(cmds))]
            children = [
                procs.start(c, None, None, log, env) for c, log in zip(cmds, logs, strict=True)
            ]
            started[name] = Pair(name, ports, children)
        for pair in started.values():
            for port, child in zip(pair.ports, pair.procs, strict=True):
                wait_port(port, child, 240.0)
        yield started
    finally:
        for pair in started.values():
            for child in pair.procs:
                procs.stop(child)
