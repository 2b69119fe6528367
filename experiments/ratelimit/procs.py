"""Processes of one experiment: the upstream, gateway pairs, their CPU time (by PID)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import yaml

from experiments.ratelimit.redisproc import free_port

_TICK = os.sysconf("SC_CLK_TCK")


def _get(url: str, timeout: float = 1.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return bytes(resp.read())


def wait_up(url: str, proc: subprocess.Popen[bytes], seconds: float = 30.0) -> None:
    """Poll ``url`` until it answers (bounded); fail if the process exits."""
    limit = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited: {proc.communicate()[1].decode()[-500:]}")
        try:
            _get(url, 0.5)
            return
        except OSError:
            if time.monotonic() > limit:
                raise RuntimeError(f"{url} never answered") from None
            time.sleep(0.05)  # readiness poll, bounded


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM by PID, SIGKILL after 10 s."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _uvicorn(app: str, port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "uvicorn", app, "--port", str(port), "--log-level", "warning",
            "--no-access-log"]  # fmt: skip
    return subprocess.Popen(args, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)  # fmt: skip


@contextmanager
def upstream() -> Iterator[str]:
    """The trivial upstream in its own uvicorn process."""
    port = free_port()
    proc = _uvicorn("experiments.ratelimit.upstream:app", port, {})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_up(url + "/", proc)
        yield url
    finally:
        stop(proc)


class Pair:
    """Two gateway processes with the same config."""

    def __init__(self, name: str, bases: list[str], procs: list[subprocess.Popen[bytes]]) -> None:
        self.name = name
        self.bases = bases
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
def pairs(configs: dict[str, dict[str, Any]], workdir: Path) -> Iterator[dict[str, Pair]]:
    """Start every pair at once (in parallel), wait until all answer, stop all at the end."""
    with ExitStack() as stack:
        started: dict[str, Pair] = {}
        for name, doc in configs.items():
            path = workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(doc))
            bases, procs = [], []
            for _ in range(2):
                port = free_port()
                env = {"BALLAST_CONFIG": str(path), "BALLAST_UPSTREAM": "", "BALLAST_LIMITER": "",
                       "BALLAST_FIXED_LIMIT": "", "BALLAST_REDIS_URL": ""}  # fmt: skip
                proc = _uvicorn("ballast_asgi.gateway:app", port, env)
                stack.callback(stop, proc)
                bases.append(f"http://127.0.0.1:{port}")
                procs.append(proc)
            started[name] = Pair(name, bases, procs)
        for pair in started.values():
            for base, proc in zip(pair.bases, pair.procs, strict=True):
                wait_up(base + "/_ballast/health", proc, 240.0)
        yield started
