"""A throwaway ``redis-server`` on a free loopback port, stopped by PID.

``start_redis(port)`` starts one without persistence and returns once it
answers PING (without ``port``, on a fresh port again if it exits at once:
another process took the port between our pick and its bind);
``redis_server()`` is the same as a context manager.
``RedisProcess.kill()`` is an outage (SIGKILL at once), ``stop()`` a shutdown.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from experiments._harness.procs import HOST, free_port, kill, terminate
from experiments._harness.servers import PORT_RETRIES

#: The bound of the wait for PING: a hang guard (a loaded shared machine can take
#: seconds to start a process).
READY_S = 60.0


@dataclass
class RedisProcess:
    """One running ``redis-server``."""

    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        """Its ``redis://`` URL."""
        return f"redis://{HOST}:{self.port}/0"

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL if it hangs (idempotent)."""
        terminate(self.proc, 5.0)

    def kill(self) -> None:
        """SIGKILL at once (an outage, not a shutdown)."""
        kill(self.proc)


def start_redis(port: int | None = None) -> RedisProcess:
    """Start ``redis-server`` without persistence; return once it answers PING."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found: run `make system-deps` (Debian redis-server)")
    for _ in range(1 if port else PORT_RETRIES):
        chosen = port or free_port()
        args = [exe, "--port", str(chosen), "--bind", HOST, "--save", "", "--appendonly", "no"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server = RedisProcess(chosen, proc)
        limit = time.monotonic() + READY_S
        while not _pong(chosen):
            if proc.poll() is not None:  # most likely the port was taken since we chose it
                break
            if time.monotonic() > limit:
                server.stop()
                raise RuntimeError(f"redis-server did not answer on port {chosen}")
            time.sleep(0.02)  # readiness poll, bounded
        else:
            return server
        server.stop()
    raise RuntimeError(f"redis-server exited at start on port {chosen}")


def _pong(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5) as s:
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
