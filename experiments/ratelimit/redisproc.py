"""Start and stop a throwaway ``redis-server`` on a free loopback port (by PID)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


def free_port() -> int:
    """An unused loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisProcess:
    """One running ``redis-server``."""

    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        """Its ``redis://`` URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL if it hangs (idempotent)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def kill(self) -> None:
        """SIGKILL at once (an outage, not a shutdown)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def start_redis(port: int | None = None) -> RedisProcess:
    """Start ``redis-server`` without persistence; return once it answers PING."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found: run `make system-deps` (Debian redis-server)")
    port = port or free_port()
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = RedisProcess(port, proc)
    limit = time.monotonic() + 10
    while not _pong(port):
        if proc.poll() is not None or time.monotonic() > limit:
            server.stop()
            raise RuntimeError(f"redis-server did not start on port {port}")
        time.sleep(0.02)  # readiness poll, bounded
    return server


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def redis_server(port: int | None = None) -> Iterator[RedisProcess]:
    """``start_redis`` as a context manager."""
    server = start_redis(port)
    try:
        yield server
    finally:
        server.stop()
