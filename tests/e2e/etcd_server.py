"""A real single-node etcd for tests: free loopback ports, a temp data dir, stopped by PID."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.e2e.support import HANG_S, POLL_S, free_port

ETCD = shutil.which("etcd")


class EtcdServer:
    """One etcd process; ``stop()`` / ``start()`` keep the same data dir and ports."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The client URL, ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.client_port}"

    def start(self) -> None:
        """Start etcd and wait (bounded) until it answers."""
        assert ETCD, "etcd is not installed (make system-deps installs etcd-server)"
        peer = f"http://127.0.0.1:{self.peer_port}"
        args = [
            ETCD, "--name", "t", "--data-dir", str(self.data_dir / "etcd"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"t={peer}", "--log-level", "error", "--logger", "zap",
        ]  # fmt: skip
        log = open(self.data_dir / "etcd.log", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(args, stdout=log, stderr=log)
        log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        import httpx

        limit = time.monotonic() + HANG_S
        while True:
            assert self.proc is not None and self.proc.poll() is None, "etcd exited"
            try:
                if httpx.get(self.url + "/health", timeout=POLL_S).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < limit, "etcd did not become healthy"
            time.sleep(0.05)  # readiness poll, bounded

    def stop(self) -> None:
        """SIGTERM by PID and wait; SIGKILL if it hangs."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def etcd_server() -> Iterator[EtcdServer]:
    """A started etcd, removed with its data dir afterwards."""
    with tempfile.TemporaryDirectory(prefix="ballast-etcd-") as tmp:
        server = EtcdServer(Path(tmp))
        server.start()
        try:
            yield server
        finally:
            server.stop()
