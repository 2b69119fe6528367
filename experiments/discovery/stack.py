"""The experiment's processes: one etcd, simulator instances that register themselves, two gateways.

Every process is started by ``Procs`` and stopped by PID. Simulators run with
``--register-etcd`` (they deregister on SIGTERM before they stop serving);
a crash is SIGKILL (no deregistration: the lease expires after its TTL).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from experiments._harness.procs import Procs, free_port, wait_port
from experiments._harness.servers import Target

SERVICE = "exp"
TTL_S = 5

GATEWAY_YAML = """\
discovery:
  etcd: {{endpoints: [{etcd}]}}
  service: {service}
retry:
  max_attempts: 3
admission:
  default_deadline_ms: 3000
"""


@dataclass
class Etcd:
    """The etcd process (restartable on the same ports and data dir)."""

    procs: Procs
    data: Path
    client_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Client URL."""
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def pid(self) -> int:
        """PID of the running etcd (0 when stopped)."""
        return self.proc.pid if self.proc is not None else 0

    def start(self) -> None:
        """Start (or restart) etcd and wait until it listens."""
        etcd = shutil.which("etcd")
        if etcd is None:
            raise SystemExit("etcd not found: `make system-deps` installs etcd-server")
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [etcd, "--name", "exp", "--data-dir", str(self.data),
               "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
               "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
               "--initial-cluster", f"exp={peer}",
               "--log-level", "error", "--logger", "zap"]  # fmt: skip
        self.proc = self.procs.start(cmd, None, self.client_port, "etcd")

    def stop(self) -> None:
        """Stop etcd by PID."""
        if self.proc is not None:
            self.procs.stop(self.proc)
            self.proc = None


@dataclass
class Sim:
    """One simulator slot: fixed ports, so a restart registers the same URL again."""

    procs: Procs
    name: str
    etcd_url: str
    port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        """The URL it registers."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def live(self) -> bool:
        """Whether it is running."""
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> float:
        """Start it (it registers itself); the wall time it started.

        Another process may have taken a port meanwhile (an outgoing connection's
        ephemeral port): then the slot moves to fresh ports (a new URL).
        """
        for _ in range(3):
            try:
                return self._start()
            except RuntimeError:
                self.port, self.admin_port = free_port(), free_port()
        return self._start()

    def _start(self) -> float:
        self.starts += 1
        cmd = [sys.executable, "-m", "ballast_tools.upstream_sim", "--port", str(self.port),
               "--admin-port", str(self.admin_port), "--workers", "64", "--fast", "2ms",
               "--slow", "10ms", "--register-etcd", self.etcd_url, "--service", SERVICE,
               "--ttl", str(TTL_S), "--seed", str(self.starts)]  # fmt: skip
        started = time.time()
        self.proc = self.procs.start(cmd, None, self.port, f"{self.name}-{self.starts}")
        return started

    def registered_at(self) -> float | None:
        """Wall time of this start's first ``registered`` event (from its log)."""
        for event in self.events():
            if event.get("event") == "registered":
                return float(str(event["at"]))
        return None

    def events(self) -> list[dict[str, object]]:
        """The registration events of this start."""
        path = self.procs.tmp / f"{self.name}-{self.starts}.log"
        out = []
        for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def stop(self) -> None:
        """Graceful: SIGTERM (deregisters, then stops serving)."""
        if self.proc is not None:
            self.procs.stop(self.proc)
            self.proc = None

    def crash(self) -> None:
        """SIGKILL: no deregistration; the lease expires after its TTL."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            if self.proc in self.procs.started:
                self.procs.started.remove(self.proc)
            self.proc = None


def start_gateway(procs: Procs, name: str, etcd_url: str) -> Target:
    """A gateway following service ``exp`` (its controller runs inside, elected)."""
    port, admin = free_port(), free_port()
    config = procs.tmp / f"{name}.yaml"
    config.write_text(GATEWAY_YAML.format(etcd=etcd_url, service=SERVICE))
    cmd = [sys.executable, "-m", "ballast_asgi", "--config", str(config),
           "--host", "127.0.0.1", "--port", str(port), "--admin-port", str(admin)]  # fmt: skip
    proc = procs.start(cmd, None, port, name, env={"BALLAST_UPSTREAM": ""})
    wait_port(admin, proc)
    return Target(name, port, proc.pid, path="/", admin_port=admin)
